-- start: claim this Edge's id with a new fence (R-SCALE-4); refused while the id's alive key
-- exists (another live process holds it).
local key = k('alive', EDGE)
if redis.call('EXISTS', key) == 1 then return result({'taken'}) end
if redis.call('EXISTS', k('fence_seq')) == 0 then redis.call('SET', k('fence_seq'), S(NOW)) end
local fence = S(redis.call('INCR', k('fence_seq')))
redis.call('HSET', k('fences'), EDGE, fence)
redis.call('SET', key, fence, 'PX', S(TTL))
return result({'ok', fence})
