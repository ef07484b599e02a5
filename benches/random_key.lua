-- wrk script: every request carries a random X-Key (so a limit keyed on it
-- never denies), and the run ends with one machine-readable line.
math.randomseed(os.time())
request = function()
  wrk.headers["X-Key"] = tostring(math.random(1, 1000000000))
  return wrk.format("GET", "/bench")
end

done = function(summary, latency, requests)
  local seconds = summary.duration / 1e6
  local errors = summary.errors.connect + summary.errors.read + summary.errors.write
    + summary.errors.timeout + summary.errors.status
  io.write(string.format("RESULT rps=%.0f p50_ms=%.3f p99_ms=%.3f errors=%d\n",
    summary.requests / seconds, latency:percentile(50) / 1000, latency:percentile(99) / 1000, errors))
end
