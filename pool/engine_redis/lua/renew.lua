-- renew: the calling Edge is alive; re-assert the leases it really holds, its ready Nodes,
-- and look up its waiters' fates (a lost PUBLISH is recovered here).
-- ARGV[6] = JSON {leases: [[id, provider, node, long, epoch]], nodes: [[node, gen,
-- refused JSON]], waiters: [id]}
local a = cjson.decode(ARGV[6])
redis.call('SET', k('alive', EDGE), FENCE, 'PX', S(TTL))
local lost, recreated = {}, 0
for _, l in ipairs(a.leases) do
  local id, pid, nid, long, epoch = l[1], l[2], l[3], l[4] == 1, l[5]
  if redis.call('EXISTS', k('lease', id)) == 1 then
    redis.call('ZADD', k('leases'), S(NOW + LEASE_MS), id)
  else
    -- After a loss of data every lease is counted again; otherwise (this Edge was too slow)
    -- only when there is room, so capacity is never exceeded.
    local key = rowkey(pid, nid)
    local r, p = row(key), prov(pid)
    local room = p and r.f < p.c and (not long or r.lf < p.l)
    if epoch ~= EPOCH or room then
      redis.call('HINCRBY', key, 'in_flight', 1)
      if long then redis.call('HINCRBY', key, 'long_in_flight', 1) end
      redis.call('HSET', k('lease', id), 'edge', EDGE, 'provider', pid, 'node', nid,
        'long', long and '1' or '0', 'epoch', EPOCH)
      redis.call('ZADD', k('leases'), S(NOW + LEASE_MS), id)
      recreated = recreated + 1
    else
      lost[#lost + 1] = id
    end
  end
end
local nodes_changed = false
for _, n in ipairs(a.nodes) do
  local nid, gen, refused = n[1], n[2], n[3]
  local cur = node(nid)
  if cur and cur.edge == EDGE and cur.gen == gen then
    redis.call('PEXPIRE', k('node', nid), S(TTL))
  elseif not cur then
    redis.call('HSET', k('node', nid), 'edge', EDGE, 'fence', FENCE, 'gen', gen, 'refused', refused)
    redis.call('PEXPIRE', k('node', nid), S(TTL))
    nodes_changed = true
  end
end
for _, wid in ipairs(a.waiters) do
  if not redis.call('ZSCORE', k('queue'), wid) then
    local v = redis.call('HMGET', k('w', wid), 'granted', 'node', 'provider', 'error', 'message')
    if v[1] and redis.call('EXISTS', k('lease', wid)) == 1 then
      local l = redis.call('HMGET', k('lease', wid), 'long', 'epoch')
      EV[#EV + 1] = {'g', wid, v[2], v[3], l[1] == '1' and 1 or 0, l[2]}
    elseif v[4] then
      EV[#EV + 1] = {'f', wid, v[4], v[5] or ''}
    else
      EV[#EV + 1] = {'f', wid, 'pool_recovering', 'the shared pool lost this request'}
    end
  end
end
if nodes_changed then changed() pump(nil) end
return result({lost = lost, recreated = recreated, version = meta('version') or false})
