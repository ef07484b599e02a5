-- fixed_window: one counter per window, windows aligned to the Unix epoch
-- (docs/algorithms.md). Cheapest, and has the boundary double burst: `limit` units at
-- the end of one window and `limit` more at the start of the next.
-- The key is a hash: w = window index, c = units admitted in it. A clock that
-- steps back keeps counting in the stored window (clock.lua).
local fixed_window = {}

-- The window counted at `now` and the units in it, from the key's {w, c}: the
-- clock's window, or the stored one if the clock stepped back from it.
function fixed_window.counted(now, a, stored)
  local current = (now - math.fmod(now, a.window)) / a.window
  local w = tonumber(stored[1])
  current = counted_window(current, w, latest_after_step_back(current, a.window))
  if w == current then
    return current, tonumber(stored[2]) or 0
  end
  return current, 0
end

-- The common decision (cost 1, `take`, plain mode): the line peek + take
-- would make; nil for a denial (the general path reports it).
function fixed_window.fast(key, now, a)
  local current, count = fixed_window.counted(now, a, redis.call('HMGET', key, 'w', 'c'))
  if count + 1 > a.limit then
    return nil
  end
  local ends = (current + 1) * a.window
  if count == 0 then
    redis.call('HSET', key, 'w', digits(current), 'c', 1)
    redis.call('PEXPIRE', key, digits(math.ceil((ends - now) / 1000) + 1))
  else
    -- The key expires at the window's end, set by its first unit.
    redis.call('HINCRBY', key, 'c', 1)
  end
  return string.format('1 1 %d %d 0', a.limit - count - 1, ends - now)
end

-- Returns whether `cost` more units fit, and the state.
function fixed_window.peek(key, now, a)
  local current, count = fixed_window.counted(now, a, redis.call('HMGET', key, 'w', 'c'))
  return count + a.cost <= a.limit, { count = count, current = current, ends = (current + 1) * a.window }
end

-- Consumes `cost` units; returns remaining, reset (until the window ends).
function fixed_window.take(key, now, a, s, member)
  if s.count == 0 then
    redis.call('HSET', key, 'w', digits(s.current), 'c', a.cost)
    redis.call('PEXPIRE', key, math.ceil((s.ends - now) / 1000) + 1)
  else
    -- The key expires at the window's end, set by its first unit.
    redis.call('HINCRBY', key, 'c', a.cost)
  end
  return a.limit - s.count - a.cost, s.ends - now
end

-- Reports without consuming: remaining, reset, retry_after.
function fixed_window.report(key, now, a, s)
  if s.count == 0 then
    return a.limit, 0, 0
  end
  local retry = 0
  if s.count + a.cost > a.limit then
    retry = s.ends - now
  end
  return math.max(a.limit - s.count, 0), s.ends - now, retry
end

-- Gives back `cost` units taken at time `taken`, if their window is current.
function fixed_window.refund(key, a, member, taken)
  local w = (taken - math.fmod(taken, a.window)) / a.window
  if tonumber(redis.call('HGET', key, 'w')) == w then
    redis.call('HINCRBY', key, 'c', -a.cost)
  end
end
