-- start: claim this Edge's id; refused while another live Edge holds it.
-- ARGV[5] = this process's instance token
local key = k('alive', EDGE)
local holder = redis.call('GET', key)
if holder and holder ~= ARGV[5] then return result('taken') end
redis.call('SET', key, ARGV[5], 'PX', S(TTL))
return result('ok')
