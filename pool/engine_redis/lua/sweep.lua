-- sweep: any Edge, every TTL/3. Expire leases nobody renewed, drop waiters of dead Edges,
-- time out overdue waiters, end ejections, fail stranded waiters, pump.
local seeds, expired, dropped = {}, 0, 0
for _, id in ipairs(redis.call('ZRANGEBYSCORE', k('leases'), '-inf', S(NOW))) do
  if drop_lease(id, seeds) then expired = expired + 1 end
end
for _, wid in ipairs(redis.call('ZRANGE', k('queue'), 0, -1)) do
  local w = waiter(wid)
  if not w then
    redis.call('ZREM', k('queue'), wid)
  else
    if not edge_alive(w) then
      dequeue(wid, w)
      redis.call('DEL', k('w', wid))
      dropped = dropped + 1
    end
  end
end
changed()
expire()
wake()
strand()
pump(nil)
return result({expired = expired, dropped = dropped})
