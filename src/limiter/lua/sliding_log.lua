-- sliding_log: the exact sliding-window log (docs/algorithms.md).
--
-- The key is a sorted set of admitted units; score = admit time (µs). A unit
-- admitted at s counts while now - s < window, so any half-open interval of
-- length `window` holds at most `limit` units. Members are unique per request
-- (member, member.2, … for cost > 1), so same-microsecond requests from many
-- gateways never collapse. Denied requests add nothing: a key never holds more
-- than `limit` entries.
local sliding_log = {}

-- Drops expired entries; returns whether `cost` more units fit, and the
-- state {count, oldest}. Reads the oldest entry first: when it is still in
-- the window (the usual case) nothing can be expired, and its score is the
-- reset that take and report need, so no second read is made.
function sliding_log.peek(key, now, a)
  local oldest = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')[2]
  if oldest ~= nil and tonumber(oldest) <= now - a.window then
    redis.call('ZREMRANGEBYSCORE', key, '-inf', now - a.window)
    oldest = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')[2]
  end
  if oldest == nil then
    return a.cost <= a.limit, { count = 0 }
  end
  local count = redis.call('ZCARD', key)
  return count + a.cost <= a.limit, { count = count, oldest = tonumber(oldest) }
end

local function oldest_frees(key, now, a, rank)
  return redis.call('ZRANGE', key, rank, rank, 'WITHSCORES')[2] + a.window - now
end

-- Consumes `cost` units; returns remaining, reset.
function sliding_log.take(key, now, a, s, member)
  redis.call('ZADD', key, now, member)
  for j = 2, a.cost do
    redis.call('ZADD', key, now, member .. '.' .. j)
  end
  local last = now
  if a.delay > 0 and s.count > 0 then
    -- Reservations may lie in the future: the key lives until the last
    -- one leaves the window.
    last = math.max(now, tonumber(redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')[2]))
  end
  redis.call('PEXPIRE', key, math.ceil((last - now + a.window) / 1000) + 1)
  local reset = a.window
  if s.count > 0 then
    reset = s.oldest + a.window - now
  end
  return a.limit - s.count - a.cost, reset
end

-- Reports without consuming: remaining, reset, retry_after.
function sliding_log.report(key, now, a, s)
  if s.count == 0 then
    return a.limit, 0, 0
  end
  local retry = 0
  local excess = s.count + a.cost - a.limit
  if excess > 0 then
    retry = oldest_frees(key, now, a, excess - 1)
  end
  return math.max(a.limit - s.count, 0), s.oldest + a.window - now, retry
end

-- Gives back the units `member` took.
function sliding_log.refund(key, a, member, taken)
  redis.call('ZREM', key, member)
  for j = 2, a.cost do
    redis.call('ZREM', key, member .. '.' .. j)
  end
end

-- For a limit that delays: the wait until `cost` more units fit, given the
-- units already admitted or reserved (some may lie in the future). The units
-- go at the time the unit that blocks them leaves the window, and never
-- before the last reservation, so any window holds at most `limit`.
function sliding_log.wait(key, now, a, s)
  local excess = s.count + a.cost - a.limit
  if excess <= 0 or a.cost > a.limit then
    return nil
  end
  local at = oldest_frees(key, now, a, excess - 1) + now
  local last = tonumber(redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')[2])
  if last > at then
    at = last
  end
  s.at = at
  return at - now
end

-- Reserves `cost` units at the time `wait` found; returns remaining, reset.
function sliding_log.reserve(key, now, a, s, member)
  redis.call('ZADD', key, s.at, member)
  for j = 2, a.cost do
    redis.call('ZADD', key, s.at, member .. '.' .. j)
  end
  redis.call('PEXPIRE', key, math.ceil((s.at - now + a.window) / 1000) + 1)
  return 0, s.oldest + a.window - now
end
