-- expire: time out overdue waiters now; returns ms until the head waiter's deadline (or -1).
expire()
local head = redis.call('ZRANGE', k('queue'), 0, 0)[1]
local timeout = meta_num('timeout_ms')
local left = -1
if head and timeout > 0 then
  local w = waiter(head)
  if w then left = math.max(0, w.enq + timeout - NOW) end
end
return result(left)
