-- sliding_log: the exact sliding-window log (docs/algorithms.md).
--
-- The key is a sorted set of admitted units; score = admit time (µs). A unit
-- admitted at s counts while now - s < window, so any half-open interval of
-- length `window` holds at most `limit` units. Members are unique per request
-- (member, member.2, … for cost > 1), so same-microsecond requests from many
-- gateways never collapse. Denied requests add nothing: a key never holds more
-- than `limit` entries.
local sliding_log = {}

-- Drops expired entries; returns whether `cost` more units fit, and the count.
function sliding_log.peek(key, now, a)
  local count = redis.call('ZCARD', key)
  if count > 0 then
    count = count - redis.call('ZREMRANGEBYSCORE', key, '-inf', now - a.window)
  end
  return count + a.cost <= a.limit, count
end

local function oldest_frees(key, now, a, rank)
  return redis.call('ZRANGE', key, rank, rank, 'WITHSCORES')[2] + a.window - now
end

-- Consumes `cost` units; returns remaining, reset.
function sliding_log.take(key, now, a, count, member)
  redis.call('ZADD', key, now, member)
  for j = 2, a.cost do
    redis.call('ZADD', key, now, member .. '.' .. j)
  end
  redis.call('PEXPIRE', key, math.ceil(a.window / 1000) + 1)
  local reset = a.window
  if count > 0 then
    reset = oldest_frees(key, now, a, 0)
  end
  return a.limit - count - a.cost, reset
end

-- Reports without consuming: remaining, reset, retry_after.
function sliding_log.report(key, now, a, count)
  if count == 0 then
    return a.limit, 0, 0
  end
  local retry = 0
  local excess = count + a.cost - a.limit
  if excess > 0 then
    retry = oldest_frees(key, now, a, excess - 1)
  end
  return math.max(a.limit - count, 0), oldest_frees(key, now, a, 0), retry
end

-- Gives back the units `member` took.
function sliding_log.refund(key, a, member, taken)
  redis.call('ZREM', key, member)
  for j = 2, a.cost do
    redis.call('ZREM', key, member .. '.' .. j)
  end
end
