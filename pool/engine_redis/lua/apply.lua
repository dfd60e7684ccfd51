-- apply: install a policy, keeping leases (R-REF-3); an older version never overwrites a
-- newer one. ARGV[6] = JSON {version, max_queue, timeout_ms, ej_after, ej_base_ms,
-- ej_max_ms, providers: [[id, node, capacity, long capacity, priority, enabled 1|0,
-- capabilities, fingerprint]], groups: {model: [provider ids]}}
local a = cjson.decode(ARGV[6])
local cur = meta('version')
if cur and tonumber(a.version) < tonumber(cur) then return result('stale') end
local old, new, order = {}, {}, {}
for _, pid in ipairs(cjson.decode(meta('pids') or '[]')) do old[pid] = prov(pid) end
for _, p in ipairs(a.providers) do
  new[p[1]] = {n = p[2], c = p[3], l = p[4], pr = p[5], e = p[6], caps = p[7], fp = p[8]}
  order[#order + 1] = p[1]
end
-- A row removed or moved keeps counting its leases under a retired key until they are back.
for pid, op in pairs(old) do
  local np = new[pid]
  if not np or np.n ~= op.n then
    local key = k('prov', pid)
    if num(redis.call('HGET', key, 'in_flight')) > 0 then
      redis.call('RENAME', key, key .. '@' .. op.n)
    else
      redis.call('DEL', key)
    end
  end
end
for _, pid in ipairs(order) do
  local np, op = new[pid], old[pid]
  local key = k('prov', pid)
  if not op or op.n ~= np.n then
    -- configured again on a node where leases remained: the row keeps its health
    if redis.call('EXISTS', key .. '@' .. np.n) == 1 then redis.call('RENAME', key .. '@' .. np.n, key) end
  end
  local fp = redis.call('HGET', key, 'fp')
  if fp ~= np.fp then
    if fp and fp ~= '' then
      local r = row(key)
      if r.h ~= 'healthy' then restore(pid, r, 'its address or profile changed') end
      redis.call('HSET', key, 'failures', 0, 'ejections', 0)
    end
    redis.call('HSET', key, 'fp', np.fp)
  end
end
redis.call('DEL', k('policy'))
redis.call('HSET', k('policy'), 'version', S(a.version), 'max_queue', S(a.max_queue),
  'timeout_ms', S(a.timeout_ms), 'ej_after', S(a.ej_after), 'ej_base_ms', tostring(a.ej_base_ms),
  'ej_max_ms', tostring(a.ej_max_ms), 'pids', cjson.encode(order))
if #order == 0 then redis.call('HSET', k('policy'), 'pids', '[]') end
for _, pid in ipairs(order) do redis.call('HSET', k('policy'), 'p:' .. pid, cjson.encode(new[pid])) end
for model, pids in pairs(a.groups) do
  redis.call('HSET', k('policy'), 'g:' .. model, #pids == 0 and '[]' or cjson.encode(pids))
end
PC = {}
changed()
strand()
expire()
pump(nil)
return result('applied')
