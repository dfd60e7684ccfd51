-- node: readiness of a Node connected to the calling Edge (R-NODE-1, R-TLS-3).
-- ARGV[6..9] = op (ready | refused | gone), node id, generation, refused JSON
local op, nid, gen, refused = ARGV[6], ARGV[7], ARGV[8], ARGV[9]
local cur = node(nid)
local mine = cur and cur.edge == EDGE and cur.gen == gen
if op == 'ready' then
  -- The newest ready wins, whichever Edge the Node connected to.
  redis.call('DEL', k('node', nid))
  redis.call('HSET', k('node', nid), 'edge', EDGE, 'fence', FENCE, 'gen', gen, 'refused', refused)
  redis.call('PEXPIRE', k('node', nid), S(TTL))
elseif op == 'refused' then
  if not mine then return result(0) end
  redis.call('HSET', k('node', nid), 'refused', refused)
else
  -- gone: a connection of this Edge at or after the ready one ended
  if not (cur and cur.edge == EDGE and tonumber(cur.gen) <= tonumber(gen)) then
    return result(0)
  end
  redis.call('DEL', k('node', nid)) -- leases stay counted until their runs release them
end
changed()
strand()
pump(nil)
return result(1)
