"""The Lua scripts of the per-token limits shared by several Edges (R-SCALE-6,
``limits_shared``). Each declares every key it touches in ``KEYS``; times are Redis's own
(``TIME``) unless a test pins them."""

from __future__ import annotations

_NOW = """
local function now_ms(override)
  if override ~= '' then return tonumber(override) end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
"""

# KEYS: slots (zset: slot -> expiry ms), window (hash: w, req, tok)
# ARGV: window ms, ttl ms, slot, max_in_flight, rpm, tpm ('' = none), estimate, now override
_ADMIT = (
    _NOW
    + """
local wms, ttl = tonumber(ARGV[1]), tonumber(ARGV[2])
local maxf, rpm, tpm = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local est = tonumber(ARGV[7])
local now = now_ms(ARGV[8])
local w = math.floor(now / wms)
local reset = (w + 1) * wms - now
local req, tok = 0, 0
local row = redis.call('HMGET', KEYS[2], 'w', 'req', 'tok')
if tonumber(row[1]) == w then
  req, tok = tonumber(row[2]) or 0, tonumber(row[3]) or 0
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
-- R-LIM-1: the slot may be this request's own, held since its headers: the others count.
local others = redis.call('ZCARD', KEYS[1])
if redis.call('ZSCORE', KEYS[1], ARGV[3]) then others = others - 1 end
-- A refused request's slot goes at once: requests deciding together never all refuse
-- each other.
if maxf and others >= maxf then
  redis.call('ZREM', KEYS[1], ARGV[3])
  return {'max_in_flight', req, tok, reset, w}
end
if rpm and req >= rpm then
  redis.call('ZREM', KEYS[1], ARGV[3])
  return {'rpm', req, tok, reset, w}
end
-- A request larger than the whole budget still runs alone in a fresh window (limits.py).
if tpm and tok > 0 and tok + est > tpm then
  redis.call('ZREM', KEYS[1], ARGV[3])
  return {'tpm', req, tok, reset, w}
end
req, tok = req + 1, tok + est
redis.call('HSET', KEYS[2], 'w', w, 'req', req, 'tok', tok)
redis.call('PEXPIRE', KEYS[2], reset + wms)
redis.call('ZADD', KEYS[1], now + ttl, ARGV[3])
redis.call('PEXPIRE', KEYS[1], ttl)
return {'ok', req, tok, reset, w}
"""
)

# KEYS: slots, window. ARGV: window ms, slot, admission window, correction ('' = none), now
_SETTLE = (
    _NOW
    + """
redis.call('ZREM', KEYS[1], ARGV[2])
local corr = tonumber(ARGV[4])
if not corr or corr == 0 then return 0 end
local wms = tonumber(ARGV[1])
local now = now_ms(ARGV[5])
local w = math.floor(now / wms)
local cw = tonumber(redis.call('HGET', KEYS[2], 'w'))
if cw == w and tonumber(ARGV[3]) == w then
  local tok = (tonumber(redis.call('HGET', KEYS[2], 'tok')) or 0) + corr
  redis.call('HSET', KEYS[2], 'tok', math.max(0, tok))
elseif corr > 0 then
  if cw ~= w then
    redis.call('HSET', KEYS[2], 'w', w, 'req', 0, 'tok', corr)
    redis.call('PEXPIRE', KEYS[2], (w + 2) * wms - now)
  else
    redis.call('HINCRBY', KEYS[2], 'tok', corr)
  end
end
return 1
"""
)

# KEYS: one slot set per token. ARGV: ttl ms, now override, then per key: n, n slots.
_RENEW = (
    _NOW
    + """
local ttl = tonumber(ARGV[1])
local expiry = now_ms(ARGV[2]) + ttl
local i = 3
for k = 1, #KEYS do
  local n = tonumber(ARGV[i])
  -- Re-added if gone: after a Redis restarted empty, live slots count again.
  for j = 1, n do redis.call('ZADD', KEYS[k], expiry, ARGV[i + j]) end
  i = i + n + 1
  redis.call('PEXPIRE', KEYS[k], ttl)
end
return 1
"""
)

SCRIPTS = {"admit": _ADMIT, "settle": _SETTLE, "renew": _RENEW}
