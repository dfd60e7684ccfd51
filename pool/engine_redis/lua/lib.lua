-- Shared prelude of every pool script (docs/pool.md, "Redis engine"); the script's own body
-- follows. ARGV[1..5] = prefix, calling Edge id, TTL ms, fixed time ms ("" = Redis TIME),
-- the calling process's fence ("" only for start.lua); script arguments start at ARGV[6].
-- Only Redis TIME is used, so Edge clocks may disagree.
local P, EDGE, TTL, FENCE = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[5]
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

-- Fencing (R-SCALE-4): an Edge is (id, fence). start.lua gives each process that claims an id
-- a new fence (INCR of {P}:fence_seq); {P}:fences names the current one per id. A call of any
-- other fence is refused whole (lib_health.lua, the end of the prelude). After a loss of data
-- (the store forgot the claim, or kept an older one: R-HA-2) the newest process of an id to
-- call claims it again, and the sequence moves past its fence: never handed out twice.
local FENCED = false
if FENCE ~= '' then
  local cur = redis.call('HGET', k('fences'), EDGE)
  if not cur or tonumber(cur) < tonumber(FENCE) then
    redis.call('HSET', k('fences'), EDGE, FENCE)
    if num(redis.call('GET', k('fence_seq'))) < tonumber(FENCE) then
      redis.call('SET', k('fence_seq'), FENCE)
    end
  elseif cur ~= FENCE then
    FENCED = cur
  end
end
-- A lease outlives its Edge's alive key by half a TTL: when that Edge dies, the Edge serving
-- its routed run cancels the run on the Node (alive key gone + TTL/3, docs/scale-out.md)
-- before the capacity is free again, so the upstream never serves more than capacity.
local LEASE_MS = TTL + math.floor(TTL / 2)

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
local function node(nid) -- {edge, gen, refused, fence} or false
  local r = NC[nid]
  if r == nil then
    local v = redis.call('HMGET', k('node', nid), 'edge', 'gen', 'refused', 'fence')
    if v[1] then
      r = {edge = v[1], gen = v[2], refused = cjson.decode(v[3] or '{}'), fence = v[4] or ''}
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

-- R-POOL-3: lowest in-flight, then lowest priority value, then (R-SCALE-5) a Node connected
-- to the asking process (edge, fence), then least recently picked, then (node, provider); a
-- long request needs a long slot too (R-POOL-7); a half-open row takes nothing while its
-- trial is out (R-HEALTH-2).
local function select(cands, long, edge, fence)
  local best, bp, br, bl
  for _, pid in ipairs(cands) do
    local p, r = prov(pid), row(k('prov', pid))
    local limit = p.c
    if r.trial ~= '0' then limit = 0 end
    if r.f < limit and not (long and r.lf >= p.l) then
      local n = node(p.n)
      local here = n and n.edge == edge and n.fence == fence
      local wins = best == nil or r.f < br.f
      if not wins and r.f == br.f then
        if p.pr ~= bp.pr then wins = p.pr < bp.pr
        elseif here ~= bl then wins = here
        elseif r.lp ~= br.lp then wins = r.lp < br.lp
        elseif p.n ~= bp.n then wins = lt(p.n, bp.n)
        else wins = lt(pid, best) end
      end
      if wins then best, bp, br, bl = pid, p, r, here end
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
  redis.call('ZADD', k('leases'), S(NOW + LEASE_MS), id)
end
