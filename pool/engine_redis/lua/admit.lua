-- admit: lease now, queue a waiter, or refuse (R-POOL-1..6, R-PRIN-3, R-HEALTH-1).
-- ARGV[6..11] = model, needs JSON, long 1|0, owner ("" none), max_queued ("" none), excl JSON
-- ARGV[12..13] = affinity key ("" none: R-AFF-1) and how long it holds, in ms
local model, needs, long = ARGV[6], cjson.decode(ARGV[7]), ARGV[8] == '1'
local owner, share, excl = ARGV[9], ARGV[10], cjson.decode(ARGV[11])
local akey, attl = ARGV[12] or '', ARGV[13] or '0'
if recovering() then return result({'error', 'pool_recovering', ''}) end
if redis.call('EXISTS', k('policy')) == 0 then return result({'error', 'pool_recovering', ''}) end
if redis.call('ZCARD', k('queue')) > 0 then expire() end
local cands, code = resolve(model, needs, long, excl)
if code then return result({'error', code, ''}) end
if #cands == 0 then return result({'error', 'no_available_provider', unavailable(model)}) end
local id = S(redis.call('INCR', k('ids')))
local pid, p, r, hit
if akey ~= '' then -- R-AFF-1: the provider that last ran the key, when it has room
  local want = redis.call('GET', k('aff', akey))
  for _, c in ipairs(cands) do
    if c == want then
      local wp, wr = prov(c), row(k('prov', c))
      local limit = wp.c
      if wr.trial ~= '0' then limit = 0 end
      if wr.f < limit and not (long and wr.lf >= wp.l) then pid, p, r, hit = c, wp, wr, true end
    end
  end
end
if not pid then pid, p, r = select(cands, long, EDGE, FENCE) end
if pid then
  take(pid, p, r, id, long, EDGE)
  if akey ~= '' then redis.call('SET', k('aff', akey), pid, 'PX', attl) end
  return result({'lease', id, p.n, pid, hit and '1' or '0'})
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
  'owner', owner, 'enq_ms', S(NOW), 'cls', cls, 'aff', akey, 'aff_ms', attl)
if owner ~= '' then redis.call('HINCRBY', k('owners'), owner, 1) end
return result({'queued', id})
