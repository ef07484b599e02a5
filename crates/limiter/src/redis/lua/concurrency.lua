-- concurrency: at most `limit` units in flight per key (docs/algorithms.md).
--
-- The key is a sorted set of leases; score = the time the lease ends by itself
-- (admit or last renewal time + `lease`, µs; `a.param`). The instance holding
-- a lease renews it while its request lives (decide.lua's renewal) and
-- releases it (ZREM) when the request ends; if the instance dies, it expires.
local concurrency = {}

-- Drops expired leases; returns whether `cost` more units fit, and the count.
function concurrency.peek(key, now, a)
  local count = redis.call('ZCARD', key)
  if count > 0 then
    count = count - redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
  end
  return count + a.cost <= a.limit, count
end

-- Time until the first lease ends by itself, never more than one `lease`
-- (a lease taken under a longer `lease` before a reload counts as if taken now).
local function first_expiry(key, now, a)
  local first = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')[2]
  if first then
    return math.min(first - now, a.param)
  end
  return 0
end

-- Takes `cost` leases; returns remaining, reset (until the first lease expires).
function concurrency.take(key, now, a, count, member)
  local ends = now + a.param
  redis.call('ZADD', key, ends, member)
  for j = 2, a.cost do
    redis.call('ZADD', key, ends, member .. '.' .. j)
  end
  redis.call('PEXPIRE', key, math.ceil(a.param / 1000) + 1)
  return a.limit - count - a.cost, first_expiry(key, now, a)
end

-- Reports without consuming. retry_after is 0: a lease may end at any moment.
function concurrency.report(key, now, a, count)
  return math.max(a.limit - count, 0), first_expiry(key, now, a), 0
end

-- The common decision (cost 1, `take`, plain mode): the line peek + take
-- would make. The first lease's end is read only when another is held
-- (alone, the new lease is the first); nil for a denial (the general path
-- reports it, the expired leases already dropped).
function concurrency.fast(key, now, a, member)
  redis.call('ZREMRANGEBYSCORE', key, '-inf', digits(now))
  local count = redis.call('ZCARD', key)
  if count + 1 > a.limit then
    return nil
  end
  local reset = a.param
  if count > 0 then
    reset = math.min(redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')[2] - now, a.param)
  end
  redis.call('ZADD', key, digits(now + a.param), member)
  redis.call('PEXPIRE', key, digits(math.ceil(a.param / 1000) + 1))
  return string.format('1 1 %d %d 0', a.limit - count - 1, reset)
end

-- Releases the leases `member` holds.
function concurrency.refund(key, a, member, taken)
  redis.call('ZREM', key, member)
  for j = 2, a.cost do
    redis.call('ZREM', key, member .. '.' .. j)
  end
end
