-- server (R-HA-2): the first script on every new connection of an Edge's writer. The epoch
-- keeps the identity of the server it lives on: INFO's run_id (new at every restart) and
-- master_replid (new when a replica is promoted). Another identity means the store may have
-- gone back in time (a promoted replica that missed the last writes, a restart that reloaded
-- an older file): a new epoch, exactly as for a Redis restarted empty (docs/pool.md). Leases
-- stay (every live Edge re-asserts its own within the grace; the rest expire by TTL), the
-- queue goes (each Edge's waiters are failed or re-asked), and lease ids and fences jump
-- past anything the old server may have handed out.
local function field(text, name) return string.match(text, name .. ':(%w+)') or '' end
local ident = field(redis.call('INFO', 'server'), 'run_id') .. ':'
  .. field(redis.call('INFO', 'replication'), 'master_replid')
local seen = redis.call('HGET', k('epoch'), 'server')
if not seen then
  redis.call('HSET', k('epoch'), 'server', ident) -- this epoch was born here (or before this)
  return result({'adopted'})
end
if seen == ident then return result({'same'}) end
local old = EPOCH
EPOCH, BORN = S(NOW), NOW
if EPOCH == old then EPOCH = EPOCH .. '.1' end
redis.call('HSET', k('epoch'), 'id', EPOCH, 'born_ms', S(NOW), 'server', ident)
-- Replication lags by far less than a billion lease grants or a million Edge starts.
redis.call('SET', k('ids'), S(math.max(num(redis.call('GET', k('ids'))) + 1e9, NOW * 1000)))
redis.call('SET', k('fence_seq'), S(math.max(num(redis.call('GET', k('fence_seq'))) + 1e6, NOW)))
for _, wid in ipairs(redis.call('ZRANGE', k('queue'), 0, -1)) do redis.call('DEL', k('w', wid)) end
for _, cls in ipairs(redis.call('HKEYS', k('classes'))) do redis.call('DEL', k('wq', cls)) end
redis.call('DEL', k('queue'), k('classes'), k('owners'))
return result({'new', old})
