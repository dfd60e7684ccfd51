-- health: verdicts on a provider (R-HEALTH-2, R-HEALTH-3), and the end of ejections.
-- ARGV[6] = op: ok <lease id> <node> <provider> | fail <lease id> <node> <provider> <reason>
-- <retry ms or ""> | probe <node> <provider> <1|0> <reason> | wake
local op = ARGV[6]
local out = 0
if op == 'ok' then
  out = succeeded(ARGV[7], ARGV[8], ARGV[9])
elseif op == 'fail' then
  local id, pid = ARGV[7], ARGV[9]
  local r = configured(ARGV[8], pid)
  if r then
    local retry = ARGV[11] ~= '' and tonumber(ARGV[11]) or nil
    if failure(pid, r, ARGV[10], retry, r.trial == id) then out = 1 end
  end
elseif op == 'probe' then
  local pid, ok, reason = ARGV[8], ARGV[9] == '1', ARGV[10]
  local r = configured(ARGV[7], pid)
  if r then
    if ok then
      if r.h == 'probing' or (r.h == 'ejected' and r.untl <= NOW) then
        local was_ejected = r.h == 'ejected'
        restore(pid, r, 'an active probe succeeded')
        if was_ejected then
          strand()
          pump(nil)
        else
          pump({[pid] = true})
        end
        out = 1
      elseif r.h == 'healthy' then
        redis.call('HSET', r.key, 'failures', 0)
      end
    elseif r.h ~= 'ejected' then
      if failure(pid, r, 'probe failed: ' .. reason, nil, r.h == 'probing') then out = 1 end
    end
  end
else
  out = wake()
end
return result(out)
