-- snapshot: exact global figures (R-POOL-8), sorted by (node, provider), plus the queue
-- shares of owners (R-PRIN-3) and the per-Edge view's inputs.
local pids = cjson.decode(meta('pids') or '[]')
table.sort(pids, function(x, y)
  local a, b = prov(x), prov(y)
  if a.n ~= b.n then return lt(a.n, b.n) end
  return lt(x, y)
end)
local queued = {}
for _, c in ipairs(classes()) do
  local n = redis.call('ZCARD', k('wq', c.id))
  for _, pid in ipairs(c.cands) do queued[pid] = (queued[pid] or 0) + n end
end
local ids = redis.call('ZRANGE', k('queue'), 0, 0)
local depth = redis.call('ZCARD', k('queue'))
local rows = {}
for _, pid in ipairs(pids) do
  local p, r = prov(pid), row(k('prov', pid))
  local n = node(p.n)
  local refusal = n and n.refused[pid] or ''
  local online = n and refusal == '' and true or false
  local ejected_ms = 0
  if r.h == 'ejected' then ejected_ms = math.max(0, r.untl - NOW) end
  rows[#rows + 1] = {p.n, pid, online, p.c, online and r.f or 0, online and r.lf or 0,
    online and (queued[pid] or 0) or 0, p.pr, p.e == 1, p.l, refusal, r.h, r.reason,
    ejected_ms, r.fail}
end
local oldest = 0
if ids[1] then
  local w = waiter(ids[1])
  if w then oldest = math.max(0, NOW - w.enq) end
end
local owners = {}
local flat = redis.call('HGETALL', k('owners'))
for i = 1, #flat, 2 do owners[#owners + 1] = {flat[i], tonumber(flat[i + 1])} end
return result({rows = rows, depth = depth, oldest_ms = oldest, owners = owners})
