-- sluice sliding_log: the exact sliding-window log, over one or more keys, all or nothing.
--
-- KEYS[i]: counter key of limit i (a sorted set; score = admit time in µs).
-- ARGV[1]: unique member for this request (gateway instance id + sequence number).
-- ARGV[3i - 1 .. 3i + 1]: limit, window (µs), cost of limit i.
--
-- The clock is Redis's own (TIME), never the gateway's. An entry admitted at s
-- counts while now - s < window, so any half-open interval of length window
-- holds at most `limit` units. A denied request changes nothing in any key, so
-- a key never holds more than `limit` entries.
--
-- Returns {admitted, then per key: remaining, reset_us, retry_after_us}, where
-- reset is the time until the oldest entry leaves the window and retry_after
-- the time until this key alone would admit this request (0 if it would now).
local t = redis.call('TIME')
local now = t[1] * 1000000 + t[2]
local member = ARGV[1]
local n = #KEYS
local counts = {}
local admit = 1

-- Pass 1: drop expired entries and count. A missing or empty key (the common
-- case for a fresh client) needs no trimming.
for i = 1, n do
  local base = 3 * i - 1
  local count = redis.call('ZCARD', KEYS[i])
  if count > 0 then
    count = count - redis.call('ZREMRANGEBYSCORE', KEYS[i], '-inf', now - ARGV[base + 1])
  end
  counts[i] = count
  if count + ARGV[base + 2] > tonumber(ARGV[base]) then
    admit = 0
  end
end

-- Pass 2: consume (only if every key admits) and report.
local out = { admit }
for i = 1, n do
  local base = 3 * i - 1
  local key = KEYS[i]
  local limit = tonumber(ARGV[base])
  local window = tonumber(ARGV[base + 1])
  local cost = tonumber(ARGV[base + 2])
  local count = counts[i]
  local retry = 0
  local reset = window
  if admit == 1 then
    redis.call('ZADD', key, now, member)
    for j = 2, cost do
      redis.call('ZADD', key, now, member .. '.' .. j)
    end
    redis.call('PEXPIRE', key, math.ceil(window / 1000) + 1)
    if count > 0 then
      reset = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')[2] + window - now
    end
    count = count + cost
  else
    local excess = count + cost - limit
    if excess > 0 then
      retry = redis.call('ZRANGE', key, excess - 1, excess - 1, 'WITHSCORES')[2] + window - now
    end
    if count > 0 then
      reset = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')[2] + window - now
    else
      reset = 0
    end
  end
  local remaining = limit - count
  if remaining < 0 then
    remaining = 0
  end
  out[#out + 1] = remaining
  out[#out + 1] = reset
  out[#out + 1] = retry
end
return out
