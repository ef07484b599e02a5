-- sluice decide: runs the algorithms above over one or more keys, all or nothing.
--
-- KEYS[i]: counter key of limit i.
-- ARGV[1]: unique member for this request (gateway instance id + sequence).
-- ARGV[2]: 'take' to decide, 'refund' to give back what ARGV[1] took at time
--          ARGV[3] (cluster refunds, and releasing concurrency leases).
-- ARGV[4 + 6(i-1) ..]: algorithm, limit, window (µs), cost, param, shadow of
--          limit i. param: buckets (sliding_window), burst (token_bucket),
--          lease µs (concurrency). shadow = 1: counts and reports, never denies.
--
-- The clock is Redis's own (TIME), never the gateway's. The request is admitted
-- if every non-shadow limit admits it; then each limit that admits it consumes
-- (a shadow limit that would deny consumes nothing, as if enforced). A denied
-- request consumes nothing anywhere.
--
-- Returns {admitted, now, then per key: allowed, remaining, reset_us,
-- retry_after_us}: `allowed` says whether this limit alone admits the request,
-- `reset` the time until the limit frees a unit, `retry_after` the time until
-- this limit alone would admit this request (0 if it would now).
local algorithms = { sliding_log, sliding_window, fixed_window, token_bucket, concurrency }
local member = ARGV[1]
local n = #KEYS
local limits = {}
for i = 1, n do
  local b = 4 + 6 * (i - 1)
  limits[i] = {
    algorithm = algorithms[tonumber(ARGV[b])],
    limit = tonumber(ARGV[b + 1]),
    window = tonumber(ARGV[b + 2]),
    cost = tonumber(ARGV[b + 3]),
    param = tonumber(ARGV[b + 4]),
    shadow = ARGV[b + 5] == '1',
  }
end

if ARGV[2] == 'refund' then
  local taken = tonumber(ARGV[3])
  for i = 1, n do
    limits[i].algorithm.refund(KEYS[i], limits[i], member, taken)
  end
  return { 1 }
end

local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local fits = {}
local states = {}
local admit = 1
for i = 1, n do
  fits[i], states[i] = limits[i].algorithm.peek(KEYS[i], now, limits[i])
  if not fits[i] and not limits[i].shadow then
    admit = 0
  end
end

local out = { admit, now }
for i = 1, n do
  local a = limits[i]
  local remaining, reset, retry
  if admit == 1 and fits[i] then
    remaining, reset = a.algorithm.take(KEYS[i], now, a, states[i], member)
    retry = 0
  else
    remaining, reset, retry = a.algorithm.report(KEYS[i], now, a, states[i])
  end
  out[#out + 1] = fits[i] and 1 or 0
  out[#out + 1] = remaining
  out[#out + 1] = reset
  out[#out + 1] = retry
end
return out
