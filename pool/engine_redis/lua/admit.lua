-- admit: lease now, queue a waiter, or refuse (R-POOL-1..6, R-PRIN-3, R-HEALTH-1).
-- ARGV[5..10] = model, needs JSON, long 1|0, owner ("" none), max_queued ("" none), excl JSON
local model, needs, long = ARGV[5], cjson.decode(ARGV[6]), ARGV[7] == '1'
local owner, share, excl = ARGV[8], ARGV[9], cjson.decode(ARGV[10])
if recovering() then return result({'error', 'pool_recovering', ''}) end
if redis.call('EXISTS', k('policy')) == 0 then return result({'error', 'pool_recovering', ''}) end
if redis.call('ZCARD', k('queue')) > 0 then expire() end
local cands, code = resolve(model, needs, long, excl)
if code then return result({'error', code, ''}) end
if #cands == 0 then return result({'error', 'no_available_provider', unavailable(model)}) end
local id = S(redis.call('INCR', k('ids')))
local pid, p, r = select(cands, long)
if pid then
  take(pid, p, r, id, long, EDGE)
  return result({'lease', id, p.n, pid})
end
if redis.call('ZCARD', k('queue')) >= meta_num('max_queue') then
  return result({'error', 'queue_full', ''})
end
if owner ~= '' and share ~= '' and num(redis.call('HGET', k('owners'), owner)) >= tonumber(share) then
  return result({'error', 'queue_full', 'this token already holds its share of the queue'})
end
local seq = S(redis.call('INCR', k('seq')))
local cls, def = class_of(model, ARGV[6], long, ARGV[10])
redis.call('ZADD', k('queue'), seq, id)
redis.call('ZADD', k('wq', cls), seq, id)
redis.call('HSET', k('classes'), cls, def)
redis.call('HSET', k('w', id), 'edge', EDGE, 'model', model, 'long', long and '1' or '0',
  'owner', owner, 'enq_ms', S(NOW), 'cls', cls)
if owner ~= '' then redis.call('HINCRBY', k('owners'), owner, 1) end
return result({'queued', id})
