-- Prelude, part 3: provider health, lease return, the result (after lib_queue.lua).

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

-- The configured ledger row of pid on node, or nil (a verdict on a removed row is dropped).
local function configured(nid, pid)
  local p = prov(pid)
  if not p or p.n ~= nid then return nil end
  return row(k('prov', pid))
end

-- The lease ``id`` of pid on node was answered (R-HEALTH-2): failures back to 0, and the
-- half-open row's trial restores it. 1 when it restored the row.
local function succeeded(id, nid, pid)
  local r = configured(nid, pid)
  if not r or r.h == 'ejected' then return 0 end
  redis.call('HSET', r.key, 'failures', 0)
  if r.h == 'probing' and r.trial == id then
    restore(pid, r, 'the trial request succeeded')
    pump({[pid] = true})
    return 1
  end
  return 0
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

-- The one fencing decision (R-SCALE-4): a process whose id was taken over does nothing.
if FENCED then return cjson.encode({e = EPOCH, fenced = FENCED}) end
