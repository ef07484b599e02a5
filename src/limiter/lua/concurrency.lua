-- concurrency: at most `limit` units in flight per key (DESIGN §4).
--
-- The key is a sorted set of leases; score = the time the lease ends by itself
-- (admit time + `lease`, µs; `a.param`). A lease is released (ZREM) when its
-- response completes; if the instance holding it dies, it simply expires.
local concurrency = {}

-- Drops expired leases; returns whether `cost` more units fit, and the count.
function concurrency.peek(key, now, a)
  local count = redis.call('ZCARD', key)
  if count > 0 then
    count = count - redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
  end
  return count + a.cost <= a.limit, count
end

local function first_expiry(key, now)
  local first = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')[2]
  if first then
    return first - now
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
  return a.limit - count - a.cost, first_expiry(key, now)
end

-- Reports without consuming. retry_after is 0: a lease may end at any moment.
function concurrency.report(key, now, a, count)
  return math.max(a.limit - count, 0), first_expiry(key, now), 0
end

-- Releases the leases `member` holds.
function concurrency.refund(key, a, member, taken)
  redis.call('ZREM', key, member)
  for j = 2, a.cost do
    redis.call('ZREM', key, member .. '.' .. j)
  end
end
