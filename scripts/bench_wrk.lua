-- wrk script of `make bench`: POST one fixed chat body; print a JSON summary line at the end.
-- BENCH_BODY (the JSON request) and BENCH_TOKEN (a client token, may be empty) come from env.
wrk.method = "POST"
wrk.body = os.getenv("BENCH_BODY")
wrk.headers["Content-Type"] = "application/json"
local token = os.getenv("BENCH_TOKEN") or ""
if token ~= "" then
  wrk.headers["Authorization"] = "Bearer " .. token
end
-- BENCH_HEADERS (optional): more request headers, one "Name: value" per line (a peer
-- gateway's routing headers, for instance).
for name, value in string.gmatch(os.getenv("BENCH_HEADERS") or "", "([^:\n]+):%s*([^\n]*)") do
  wrk.headers[name] = value
end

-- BENCH_PORTS (optional, "p1,p2"): wrk runs one thread per port and each thread's
-- connections go to its own port on 127.0.0.1, so one run spreads over several Edges.
local ports = {}
for port in string.gmatch(os.getenv("BENCH_PORTS") or "", "%d+") do
  table.insert(ports, port)
end
local threads = 0
setup = function(thread)
  if #ports > 0 then
    thread.addr = wrk.lookup("127.0.0.1", ports[threads % #ports + 1])[1]
    threads = threads + 1
  end
end

done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'BENCH {"requests":%d,"duration_us":%d,"bytes":%d,"p50_us":%d,"p99_us":%d,"max_us":%d,' ..
    '"errors":{"connect":%d,"read":%d,"write":%d,"status":%d,"timeout":%d}}\n',
    summary.requests, summary.duration, summary.bytes,
    latency:percentile(50), latency:percentile(99), latency.max,
    e.connect, e.read, e.write, e.status, e.timeout))
end
