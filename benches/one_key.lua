-- wrk script: every request carries the same X-Key, so after the first
-- `limit` requests every one is denied (the flood scenario).
request = function()
  wrk.headers["X-Key"] = "flood"
  return wrk.format("GET", "/bench")
end

done = function(summary, latency, requests)
  local seconds = summary.duration / 1e6
  local errors = summary.errors.connect + summary.errors.read + summary.errors.write
    + summary.errors.timeout
  io.write(string.format("RESULT rps=%.0f p50_ms=%.3f p99_ms=%.3f errors=%d\n",
    summary.requests / seconds, latency:percentile(50) / 1000, latency:percentile(99) / 1000, errors))
end
