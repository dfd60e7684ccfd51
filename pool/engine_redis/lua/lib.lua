-- Shared prelude of every pool script (docs/pool.md, "Redis engine"); the script's own body
-- follows. ARGV[1..4] = prefix, calling Edge id, TTL ms, fixed time ms ("" = Redis TIME);
-- script arguments start at ARGV[5]. Only Redis TIME is used, so Edge clocks may disagree.
local P, EDGE, TTL = ARGV[1], ARGV[2], tonumber(ARGV[3])
local NOW
if ARGV[4] ~= '' then
  NOW = tonumber(ARGV[4])
else
  local t = redis.call('TIME')
  NOW = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local EV = {} -- fates of the calling Edge's own waiters, in order (others get a PUBLISH)
local INFO = {} -- health transitions for the calling Edge's log

local function S(n) return string.format('%d', n) end
local function k(...) return P .. ':' .. table.concat({...}, ':') end
local function num(v) return tonumber(v) or 0 end

-- Byte order, as Python compares str (Lua's < follows the server's locale).
local function lt(a, b)
  local n = math.min(#a, #b)
  for i = 1, n do
    local x, y = a:byte(i), b:byte(i)
    if x ~= y then return x < y end
  end
  return #a < #b
end

-- Epoch: created by the first script that finds it missing (a new or emptied Redis).
local EPOCH, BORN
do
  local e = redis.call('HMGET', k('epoch'), 'id', 'born_ms')
  if e[1] then
    EPOCH, BORN = e[1], tonumber(e[2])
  else
    EPOCH, BORN = S(NOW), NOW
    redis.call('HSET', k('epoch'), 'id', EPOCH, 'born_ms', S(NOW))
    -- ids keep growing across a loss of data: a re-asserted old lease id is never reissued
    if redis.call('EXISTS', k('ids')) == 0 then redis.call('SET', k('ids'), S(NOW * 1000)) end
  end
end
local function recovering() return NOW - BORN < TTL end

local function meta(field) return redis.call('HGET', k('policy'), field) end
local function meta_num(field) return num(meta(field)) end

local PC = {}
local function prov(pid) -- policy record {n, c, l, pr, e, caps, fp} or false
  local r = PC[pid]
  if r == nil then
    local raw = redis.call('HGET', k('policy'), 'p:' .. pid)
    r = raw and cjson.decode(raw) or false
    PC[pid] = r
  end
  return r
end

local NC = {}
local function node(nid) -- {edge, gen, refused} or false
  local r = NC[nid]
  if r == nil then
    local v = redis.call('HMGET', k('node', nid), 'edge', 'gen', 'refused')
    if v[1] then
      r = {edge = v[1], gen = v[2], refused = cjson.decode(v[3] or '{}')}
    else
      r = false
    end
    NC[nid] = r
  end
  return r
end

-- The ledger row of pid on node: the configured row, or a retired one (moved or removed
-- while leases remained).
local function rowkey(pid, nid)
  local p = prov(pid)
  if p and p.n == nid then return k('prov', pid) end
  return k('prov', pid) .. '@' .. nid
end

local FIELDS = {'in_flight', 'long_in_flight', 'last_pick', 'health', 'failures', 'ejections',
  'until_ms', 'trial', 'reason', 'fp'}
local function row(key)
  local v = redis.call('HMGET', key, unpack(FIELDS))
  return {key = key, f = num(v[1]), lf = num(v[2]), lp = num(v[3]), h = v[4] or 'healthy',
    fail = num(v[5]), ej = num(v[6]), untl = num(v[7]), trial = v[8] or '0',
    reason = v[9] or '', fp = v[10] or ''}
end

local function live(pid, p)
  if not p or p.e ~= 1 or p.c < 1 then return false end
  local n = node(p.n)
  if not n or n.refused[pid] then return false end
  return row(k('prov', pid)).h ~= 'ejected'
end

local function covers(caps, needs)
  for _, need in ipairs(needs) do
    local found = false
    for _, c in ipairs(caps) do if c == need then found = true break end end
    if not found then return false end
  end
  return true
end

-- Live candidates of (model, needs, long, excluded) (R-POOL-1, R-HEALTH-1); a code when the
-- model is unknown (R-CFG-1) or no member covers the needs (R-PROF-4).
local RC = {}
local function resolve(model, needs, long, excl)
  local ck = model .. '\0' .. cjson.encode(needs) .. '\0' .. tostring(long) .. '\0' .. cjson.encode(excl)
  local hit = RC[ck]
  if hit then return hit[1], hit[2] end
  local g = meta('g:' .. model)
  local found, code = {}, nil
  if not g then
    code = 'model_not_found'
  else
    local ex = {}
    for _, pid in ipairs(excl) do ex[pid] = true end
    local admitted = false
    for _, pid in ipairs(cjson.decode(g)) do
      local p = prov(pid)
      if p and covers(p.caps, needs) then
        admitted = true
        if live(pid, p) and (not long or p.l > 0) and not ex[pid] then found[#found + 1] = pid end
      end
    end
    if not admitted then code = 'unsupported_operation' end
  end
  RC[ck] = {found, code}
  return found, code
end
local function changed() RC, NC = {}, {} end -- liveness moved: forget cached candidates

-- R-POOL-3: lowest in-flight, then lowest priority value, then least recently picked, then
-- (node, provider); a long request needs a long slot too (R-POOL-7); a half-open row takes
-- nothing while its trial is out (R-HEALTH-2).
local function select(cands, long)
  local best, bp, br
  for _, pid in ipairs(cands) do
    local p, r = prov(pid), row(k('prov', pid))
    local limit = p.c
    if r.trial ~= '0' then limit = 0 end
    if r.f < limit and not (long and r.lf >= p.l) then
      local wins = best == nil or r.f < br.f
      if not wins and r.f == br.f then
        if p.pr ~= bp.pr then wins = p.pr < bp.pr
        elseif r.lp ~= br.lp then wins = r.lp < br.lp
        elseif p.n ~= bp.n then wins = lt(p.n, bp.n)
        else wins = lt(pid, best) end
      end
      if wins then best, bp, br = pid, p, r end
    end
  end
  return best, bp, br
end

local function take(pid, p, r, id, long, edge)
  redis.call('HINCRBY', r.key, 'in_flight', 1)
  if long then redis.call('HINCRBY', r.key, 'long_in_flight', 1) end
  if r.h ~= 'healthy' and r.trial == '0' then redis.call('HSET', r.key, 'trial', id) end
  redis.call('HSET', r.key, 'last_pick', S(redis.call('INCR', k('picks'))))
  redis.call('HSET', k('lease', id), 'edge', edge, 'provider', pid, 'node', p.n,
    'long', long and '1' or '0', 'epoch', EPOCH)
  redis.call('ZADD', k('leases'), S(NOW + TTL), id)
end

-- Waiters ----------------------------------------------------------------------------------
local function waiter(wid)
  local v = redis.call('HMGET', k('w', wid), 'edge', 'model', 'long', 'owner', 'enq_ms', 'cls')
  if not v[1] then return nil end
  return {edge = v[1], model = v[2], long = v[3] == '1', owner = v[4] or '', enq = num(v[5]),
    cls = v[6]}
end

-- A wait class groups waiters of one (model, needs, long, excluded): same candidates. Each has
-- its own queue ``{P}:wq:{class}`` (waiter -> seq), so a pump looks at class heads only.
local function class_of(model, needs_json, long, excl_json)
  local def = cjson.encode({model, needs_json, long and 1 or 0, excl_json})
  return redis.sha1hex(def), def
end

local ALIVE = {}
local function edge_alive(edge)
  if ALIVE[edge] == nil then
    ALIVE[edge] = edge == EDGE or redis.call('EXISTS', k('alive', edge)) == 1
  end
  return ALIVE[edge]
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
    local pid, p, r = select(c.cands, c.long)
    if pid then
      local w = waiter(bid)
      if not w then
        redis.call('ZREM', k('wq', c.id), bid)
      elseif not edge_alive(w.edge) then
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

-- Health (R-HEALTH-2, R-HEALTH-3): the rules of pool/engine/health.py on a Redis row.
local function hpol()
  return meta_num('ej_after'), meta_num('ej_base_ms'), meta_num('ej_max_ms')
end
local function backoff_ms(ejections)
  local _, base, mx = hpol()
  return math.min(base * 2 ^ math.min(ejections, 32), mx)
end

local function eject(pid, r, reason, ms)
  local _, _, mx = hpol()
  ms = math.max(0, math.min(ms, mx))
  INFO[#INFO + 1] = {'ejected', pid, r.h, ms, reason}
  r.h, r.untl, r.ej, r.fail, r.trial, r.reason = 'ejected', NOW + ms, r.ej + 1, 0, '0', reason
  redis.call('HSET', r.key, 'health', 'ejected', 'until_ms', S(r.untl), 'ejections', r.ej,
    'failures', 0, 'trial', '0', 'reason', reason)
  changed()
  strand() -- out of every candidate list; waiters left with none fail at once
end

local function restore(pid, r, how)
  INFO[#INFO + 1] = {'healthy', pid, r.h, 0, how}
  r.h, r.fail, r.ej, r.trial, r.untl, r.reason = 'healthy', 0, 0, '0', 0, ''
  redis.call('HSET', r.key, 'health', 'healthy', 'failures', 0, 'ejections', 0, 'trial', '0',
    'until_ms', 0, 'reason', '')
  changed()
end

-- A failure before the first byte; true when it ejected the row.
local function failure(pid, r, reason, retry_ms, trial)
  local after = hpol()
  if after == 0 then return false end
  if r.h == 'probing' then
    if not trial then return false end
    eject(pid, r, 'trial failed: ' .. reason, retry_ms or backoff_ms(r.ej))
    return true
  end
  if r.h ~= 'healthy' then return false end
  r.fail = r.fail + 1
  redis.call('HSET', r.key, 'failures', r.fail)
  if retry_ms then
    eject(pid, r, reason, retry_ms)
    return true
  end
  if r.fail >= after then
    local times = r.fail == 1 and '1 failure' or (r.fail .. ' failures')
    eject(pid, r, reason .. ' (' .. times .. ' in a row)', backoff_ms(r.ej))
    return true
  end
  return false
end

-- Rows whose ejection is over take one trial request each; pumps when any woke.
local function wake()
  local woke = 0
  for _, pid in ipairs(cjson.decode(meta('pids') or '[]')) do
    local r = row(k('prov', pid))
    if r.h == 'ejected' and r.untl <= NOW then
      redis.call('HSET', r.key, 'health', 'probing', 'trial', '0')
      INFO[#INFO + 1] = {'probing', pid, 'ejected', 0, ''}
      woke = woke + 1
    end
  end
  if woke > 0 then
    changed()
    strand()
    pump(nil)
  end
  return woke
end

-- Take a lease back; true when it existed. ``seeds`` collects freed configured providers.
local function drop_lease(id, seeds)
  local l = redis.call('HMGET', k('lease', id), 'provider', 'node', 'long')
  redis.call('ZREM', k('leases'), id)
  if not l[1] then return false end
  redis.call('DEL', k('lease', id))
  local pid, nid = l[1], l[2]
  local key = rowkey(pid, nid)
  local left = redis.call('HINCRBY', key, 'in_flight', -1)
  if l[3] == '1' then redis.call('HINCRBY', key, 'long_in_flight', -1) end
  if redis.call('HGET', key, 'trial') == id then
    redis.call('HSET', key, 'trial', '0') -- a trial ended with no verdict: let another through
  end
  if key ~= k('prov', pid) then
    if left <= 0 then redis.call('DEL', key) end -- a retired row's last lease
  else
    seeds[pid] = true
  end
  return true
end

local function result(r)
  return cjson.encode({e = EPOCH, b = S(BORN), n = S(NOW), ev = EV, info = INFO, r = r})
end
