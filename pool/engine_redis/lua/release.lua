-- release: give leases back (each at most once, R-POOL-9) and pump the freed providers.
-- ARGV[6..] = lease ids; or ARGV[6..9] = '+', lease id, node, provider: that lease's
-- ``succeeded`` verdict (health.lua ``ok``) first, then its return, in one call (the writer
-- folds the two when they are sent together). Returns the verdict's answer, else 0.
local seeds, out = {}, 0
if ARGV[6] == '+' then
  out = succeeded(ARGV[7], ARGV[8], ARGV[9])
  drop_lease(ARGV[7], seeds)
else
  for i = 6, #ARGV do drop_lease(ARGV[i], seeds) end
end
changed()
pump(seeds)
return result(out)
