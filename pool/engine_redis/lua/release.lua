-- release: give leases back (each at most once, R-POOL-9) and pump the freed providers.
-- ARGV[6..] = lease ids
local seeds, done = {}, {}
for i = 6, #ARGV do done[#done + 1] = drop_lease(ARGV[i], seeds) and 1 or 0 end
changed()
pump(seeds)
return result(done)
