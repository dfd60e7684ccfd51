-- Prelude, part 2: the one queue, its wait classes, the pump (after lib.lua).

-- Waiters ----------------------------------------------------------------------------------
local function waiter(wid)
  local v = redis.call('HMGET', k('w', wid), 'edge', 'model', 'long', 'owner', 'enq_ms', 'cls',
    'fence')
  if not v[1] then return nil end
  return {edge = v[1], model = v[2], long = v[3] == '1', owner = v[4] or '', enq = num(v[5]),
    cls = v[6], fence = v[7] or ''}
end

-- A wait class groups waiters of one (model, needs, long, excluded): same candidates. Each has
-- its own queue ``{P}:wq:{class}`` (waiter -> seq), so a pump looks at class heads only.
local function class_of(model, needs_json, long, excl_json)
  local def = cjson.encode({model, needs_json, long and 1 or 0, excl_json})
  return redis.sha1hex(def), def
end

-- A waiter's process is alive while its id's alive key holds its fence (R-SCALE-4).
local ALIVE = {}
local function edge_alive(w)
  if w.edge == EDGE and w.fence == FENCE then return true end
  local key = w.edge .. '\0' .. w.fence
  if ALIVE[key] == nil then ALIVE[key] = redis.call('GET', k('alive', w.edge)) == w.fence end
  return ALIVE[key]
end

local function notify(edge, msg)
  if edge == EDGE then
    EV[#EV + 1] = msg
  else
    redis.call('PUBLISH', k('edge', edge, 'pool'), cjson.encode(msg))
  end
end

local function dequeue(wid, w)
  redis.call('ZREM', k('queue'), wid)
  redis.call('ZREM', k('wq', w.cls), wid)
  if redis.call('EXISTS', k('wq', w.cls)) == 0 then redis.call('HDEL', k('classes'), w.cls) end
  if w.owner ~= '' and redis.call('HINCRBY', k('owners'), w.owner, -1) <= 0 then
    redis.call('HDEL', k('owners'), w.owner)
  end
end

local function grant(wid, w, pid, p, r)
  dequeue(wid, w)
  take(pid, p, r, wid, w.long, w.edge)
  -- R-AFF-1: a waiter with an affinity key: the provider the pool's rule chose is remembered
  local aff = redis.call('HMGET', k('w', wid), 'aff', 'aff_ms')
  if aff[1] and aff[1] ~= '' then redis.call('SET', k('aff', aff[1]), pid, 'PX', aff[2]) end
  redis.call('HSET', k('w', wid), 'granted', wid, 'node', p.n, 'provider', pid)
  redis.call('PEXPIRE', k('w', wid), S(3 * TTL))
  notify(w.edge, {'g', wid, p.n, pid, w.long and 1 or 0, EPOCH})
end

local function fail(wid, w, code, message)
  dequeue(wid, w)
  redis.call('HSET', k('w', wid), 'error', code, 'message', message or '')
  redis.call('PEXPIRE', k('w', wid), S(3 * TTL))
  notify(w.edge, {'f', wid, code, message or ''})
end

-- R-HEALTH-2: when ejections leave nothing, the message says why and for how long.
local function unavailable(model)
  local first, fr
  local g = meta('g:' .. model)
  for _, pid in ipairs(g and cjson.decode(g) or {}) do
    if prov(pid) then
      local r = row(k('prov', pid))
      if r.h == 'ejected' and (fr == nil or r.untl < fr.untl) then first, fr = pid, r end
    end
  end
  if not first then return '' end
  return string.format('every available provider of this model is ejected after upstream '
    .. 'failures (%s: %s; back in %.0f s)', first, fr.reason, math.max(0, fr.untl - NOW) / 1000)
end

-- Every wait class with its live candidates: {id, long, model, cands}.
local function classes()
  local out = {}
  local flat = redis.call('HGETALL', k('classes'))
  for i = 1, #flat, 2 do
    local d = cjson.decode(flat[i + 1])
    local long = d[3] == 1
    out[#out + 1] = {id = flat[i], long = long, model = d[1],
      cands = resolve(d[1], cjson.decode(d[2]), long, cjson.decode(d[4]))}
  end
  return out
end

-- Every waiter left without a live candidate fails at once (R-POOL-6), in queue order.
local function strand()
  local stranded = {}
  for _, c in ipairs(classes()) do
    if #c.cands == 0 then
      local ids = redis.call('ZRANGE', k('wq', c.id), 0, -1, 'WITHSCORES')
      for i = 1, #ids, 2 do stranded[#stranded + 1] = {ids[i], tonumber(ids[i + 1]), c.model} end
    end
  end
  table.sort(stranded, function(x, y) return x[2] < y[2] end)
  for _, s in ipairs(stranded) do
    local w = waiter(s[1])
    if w then fail(s[1], w, 'no_available_provider', unavailable(s[3])) end
  end
end

-- Waiters whose enqueue time + the queue timeout has passed (one timeout: queue order).
local function expire()
  local timeout = meta_num('timeout_ms')
  if timeout == 0 then return end
  while true do
    local head = redis.call('ZRANGE', k('queue'), 0, 0)[1]
    if not head then return end
    local w = waiter(head)
    if not w then
      redis.call('ZREM', k('queue'), head)
    elseif w.enq + timeout > NOW then
      return
    else
      fail(head, w, 'queue_timeout', '')
    end
  end
end

-- R-POOL-5 across Edges: grant the earliest waiter whose class has room, repeatedly. Room
-- only shrinks during a pump, so a class found without room is done for this pump.
-- ``seeds`` (a set of freed provider ids, or nil = all) limits it to classes listing one.
local function pump(seeds)
  if recovering() then return end
  local open = {}
  for _, c in ipairs(classes()) do
    local listed = seeds == nil
    if not listed then
      for _, pid in ipairs(c.cands) do if seeds[pid] then listed = true break end end
    end
    if listed and #c.cands > 0 then open[#open + 1] = c end
  end
  while #open > 0 do
    local bi, bid, bseq
    for i = #open, 1, -1 do
      local head = redis.call('ZRANGE', k('wq', open[i].id), 0, 0, 'WITHSCORES')
      if not head[1] then
        table.remove(open, i)
        if bi then bi = bi - 1 end
      elseif bseq == nil or tonumber(head[2]) < bseq then
        bi, bid, bseq = i, head[1], tonumber(head[2])
      end
    end
    if not bi then return end
    local c = open[bi]
    local w = waiter(bid)
    local pid, p, r
    if w then pid, p, r = select(c.cands, c.long, w.edge, w.fence) end
    if pid or not w then
      if not w then
        redis.call('ZREM', k('wq', c.id), bid)
      elseif not edge_alive(w) then
        dequeue(bid, w) -- its Edge is gone: nobody would take or renew the lease
        redis.call('DEL', k('w', bid))
      else
        grant(bid, w, pid, p, r)
      end
    else
      table.remove(open, bi)
    end
  end
end
