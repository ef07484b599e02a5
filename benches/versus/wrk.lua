-- wrk script of the side-by-side benchmark (benches/versus/).
--   wrk ... -s wrk.lua -- <scenario>
-- allowed: every request carries one of 100,000 keys at random (never denied)
-- flood:   every request carries the key "flood" (all but the first `limit` denied)
-- mix:     10 % "flood", 90 % one of 100,000 keys
-- fresh:   one of 100,000 keys at random as `?k=`, and `Connection: close`:
--          every request on a new connection (never denied)
-- Ends with one machine-readable line; latencies in microseconds.
local scenario = "allowed"

function init(args)
  scenario = args[1] or "allowed"
  math.randomseed(42)
end

function request()
  if scenario == "fresh" then
    wrk.headers["Connection"] = "close"
    return wrk.format("GET", "/bench?k=" .. tostring(math.random(1, 100000)))
  end
  local key
  if scenario == "flood" or (scenario == "mix" and math.random() < 0.1) then
    key = "flood"
  else
    key = tostring(math.random(1, 100000))
  end
  wrk.headers["X-Key"] = key
  return wrk.format("GET", "/bench")
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format("RESULT requests=%d duration_us=%d mean_us=%d p50_us=%d p99_us=%d socket_errors=%d status_errors=%d\n",
    summary.requests, summary.duration, latency.mean, latency:percentile(50), latency:percentile(99),
    e.connect + e.read + e.write + e.timeout, e.status))
end
