-- admit: lease now, queue a waiter, or refuse (R-POOL-1..6, R-PRIN-3, R-HEALTH-1).
-- ARGV[6..11] = model, needs JSON, long 1|0, owner ("" none), max_queued ("" none), excl JSON
local model, needs, long = ARGV[6], cjson.decode(ARGV[7]), ARGV[8] == '1'
local owner, share, excl = ARGV[9], ARGV[10], cjson.decode(ARGV[11])
if recovering() then return result({'error', 'pool_recovering', ''}) end
if redis.call('EXISTS', k('policy')) == 0 then return result({'error', 'pool_recovering', ''}) end
if redis.call('ZCARD', k('queue')) > 0 then expire() end
local cands, code = resolve(model, needs, long, excl)
if code then return result({'error', code, ''}) end
if #cands == 0 then return result({'error', 'no_available_provider', unavailable(model)}) end
local id = S(redis.call('INCR', k('ids')))
local pid, p, r = select(cands, long, EDGE, FENCE)
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
local cls, def = class_of(model, ARGV[7], long, ARGV[11])
redis.call('ZADD', k('queue'), seq, id)
redis.call('ZADD', k('wq', cls), seq, id)
redis.call('HSET', k('classes'), cls, def)
redis.call('HSET', k('w', id), 'edge', EDGE, 'fence', FENCE, 'model', model, 'long', long and '1' or '0',
  'owner', owner, 'enq_ms', S(NOW), 'cls', cls)
if owner ~= '' then redis.call('HINCRBY', k('owners'), owner, 1) end
return result({'queued', id})
