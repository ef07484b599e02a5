-- token_bucket: GCRA, one value per key (docs/algorithms.md).
--
-- The bucket refills one unit every T = ceil(window / limit) µs (rounded up to
-- the microsecond, so never faster than `limit` per `window`) and holds at most
-- `burst` units (`a.param`). The key stores the theoretical arrival time (TAT):
-- when the bucket would be full again. A request of `cost` units is admitted
-- if TAT' - burst·T <= now, where TAT' = max(TAT, now) + cost·T.
--
-- A TAT beyond now + burst·T + max_delay cannot come from these parameters
-- (admission keeps TAT' <= now + burst·T, and a delayed admission within
-- max_delay of that); it was written under a longer window or a
-- larger burst (a reload). It is read as an empty bucket under the current
-- ones, so the wait for `cost` units is never more than cost·T.
local token_bucket = {}

-- Returns whether `cost` units are in the bucket now, and the state.
function token_bucket.peek(key, now, a)
  local interval = math.ceil(a.window / a.limit)
  local tat = tonumber(redis.call('GET', key)) or now
  if tat < now then
    tat = now
  elseif tat > now + interval * a.param + a.delay then
    tat = now + interval * a.param + a.delay
  end
  local new_tat = tat + interval * a.cost
  local allow_at = new_tat - interval * a.param
  return allow_at <= now, { tat = tat, new_tat = new_tat, allow_at = allow_at, interval = interval }
end

-- The common decision (cost 1, `take`, plain mode): the line peek + take
-- or peek + report would make, with no state table.
function token_bucket.fast(key, now, a)
  local interval = math.ceil(a.window / a.limit)
  local span = interval * a.param
  local tat = tonumber(redis.call('GET', key)) or now
  if tat < now then
    tat = now
  elseif tat > now + span then
    tat = now + span
  end
  local new_tat = tat + interval
  local allow_at = new_tat - span
  if allow_at > now then
    local remaining = a.param - math.ceil((tat - now) / interval)
    if remaining < 0 then
      remaining = 0
    end
    return string.format('0 0 %d %d %d', remaining, tat - now, allow_at - now)
  end
  redis.call('SET', key, digits(new_tat), 'PX', digits(math.ceil((new_tat - now) / 1000) + 1))
  return string.format('1 1 %d %d 0', math.floor((now - allow_at) / interval), new_tat - now)
end

-- Consumes `cost` units; returns remaining, reset (until the bucket is full).
function token_bucket.take(key, now, a, s, member)
  redis.call('SET', key, digits(s.new_tat), 'PX', math.ceil((s.new_tat - now) / 1000) + 1)
  return math.floor((now - s.allow_at) / s.interval), s.new_tat - now
end

-- Reports without consuming: remaining, reset, retry_after.
function token_bucket.report(key, now, a, s)
  local retry = 0
  if s.allow_at > now then
    retry = s.allow_at - now
  end
  local remaining = a.param - math.ceil((s.tat - now) / s.interval)
  if remaining < 0 then
    remaining = 0
  end
  return remaining, s.tat - now, retry
end

-- Gives back `cost` units.
function token_bucket.refund(key, a, member, taken)
  local tat = tonumber(redis.call('GET', key))
  if tat then
    local interval = math.ceil(a.window / a.limit)
    redis.call('SET', key, digits(tat - interval * a.cost), 'KEEPTTL')
  end
end

-- For a limit that delays: the wait until `cost` units are in the bucket.
function token_bucket.wait(key, now, a, s)
  return s.allow_at - now
end

-- Takes the units now, their wait ahead of them; returns remaining, reset.
function token_bucket.reserve(key, now, a, s, member)
  redis.call('SET', key, digits(s.new_tat), 'PX', math.ceil((s.new_tat - now) / 1000) + 1)
  return 0, s.new_tat - now
end
