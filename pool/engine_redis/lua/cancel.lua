-- cancel: the caller of a waiter went away. Out of the queue at once; when a pump already
-- granted it, the lease is handed back to the caller to release (R-POOL-9).
-- ARGV[6] = waiter id
local wid = ARGV[6]
local w = waiter(wid)
local out = {'gone'}
if w and redis.call('ZSCORE', k('queue'), wid) then
  dequeue(wid, w)
  out = {'cancelled'}
else
  local g = redis.call('HMGET', k('w', wid), 'granted', 'node', 'provider')
  if g[1] and redis.call('EXISTS', k('lease', wid)) == 1 then
    local l = redis.call('HMGET', k('lease', wid), 'long', 'epoch')
    out = {'granted', wid, g[2], g[3], l[1] == '1' and 1 or 0, l[2]}
  end
end
redis.call('DEL', k('w', wid))
return result(out)
