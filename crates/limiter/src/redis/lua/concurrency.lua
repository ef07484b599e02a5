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

-- Releases the leases `member` holds.
function concurrency.refund(key, a, member, taken)
  redis.call('ZREM', key, member)
  for j = 2, a.cost do
    redis.call('ZREM', key, member .. '.' .. j)
  end
end
