-- sliding_window: sub-window counters in one hash (docs/algorithms.md).
--
-- The window is cut into `buckets` sub-windows of size s = window / buckets
-- (`a.param`; the config guarantees s is a whole number of µs), aligned to the
-- Unix epoch. Field = sub-window index, value = units admitted in it. A
-- request in sub-window i counts sub-windows i - buckets .. i: buckets + 1 of
-- them, which together cover the whole of (now - window, now]. Hence no
-- overshoot: in any interval of length `window`, at most `limit` units are
-- admitted. The price is on the strict side: a unit frees between `window`
-- and `window + s` after it was taken. Memory: at most buckets + 1 fields.
--
-- The current sub-window is the clock's, or the newest stored one when
-- Redis's clock stepped back from it (clock.lua): units are never counted in
-- a sub-window earlier than one already counted in. A sub-window index
-- further ahead than a step back could leave it was written with another
-- sub-window size (a reload changed `window` or `buckets`): it is dropped
-- with the ones too old to count, so every counted sub-window frees within
-- window + s, whatever the key held before.
local sliding_window = {}

local function index(now, size)
  return (now - math.fmod(now, size)) / size
end

local function field(i)
  return digits(i)
end

-- Drops sub-windows that no longer count; returns whether `cost` more units
-- fit, and the state.
function sliding_window.peek(key, now, a)
  local size = a.window / a.param
  local current = index(now, size)
  local flat = redis.call('HGETALL', key)
  -- A clock that stepped back keeps counting in the newest stored sub-window.
  local latest = latest_after_step_back(current, size)
  for i = 1, #flat, 2 do
    current = counted_window(current, tonumber(flat[i]), latest)
  end
  local oldest = current - a.param
  local count = 0
  local buckets = {}
  for i = 1, #flat, 2 do
    local at = tonumber(flat[i])
    local units = tonumber(flat[i + 1])
    if at == nil or units == nil or at < oldest or at > current then
      redis.call('HDEL', key, flat[i])
    else
      count = count + units
      buckets[#buckets + 1] = { at, units }
    end
  end
  table.sort(buckets, function(x, y) return x[1] < y[1] end)
  return count + a.cost <= a.limit, { count = count, buckets = buckets, current = current, size = size }
end

-- The common decision (cost 1, `take`, plain mode): the line peek + take
-- would make, with no table but the stale fields' (dropped in one HDEL);
-- nil for a denial (the general path reports it, the stale fields already
-- gone). The key's expiry is set when a sub-window's field is made: it
-- outlives that sub-window's count, and so every older one's.
function sliding_window.fast(key, now, a)
  local buckets = a.param
  local size = a.window / buckets
  local current = index(now, size)
  local flat = redis.call('HGETALL', key)
  local n = #flat
  if n > 0 then
    local latest = latest_after_step_back(current, size)
    for i = 1, n, 2 do
      current = counted_window(current, tonumber(flat[i]), latest)
    end
  end
  local oldest = current - buckets
  local count, first, stale = 0, current, nil
  for i = 1, n, 2 do
    local at, units = tonumber(flat[i]), tonumber(flat[i + 1])
    if at == nil or units == nil or at < oldest or at > current then
      stale = stale or {}
      stale[#stale + 1] = flat[i]
    else
      count = count + units
      if at < first then
        first = at
      end
    end
  end
  if stale then
    redis.call('HDEL', key, unpack(stale))
  end
  if count + 1 > a.limit then
    return nil
  end
  if redis.call('HINCRBY', key, field(current), 1) == 1 then
    redis.call('PEXPIRE', key, digits(math.ceil((a.window + size) / 1000) + 1))
  end
  return string.format('1 1 %d %d 0', a.limit - count - 1, (first + buckets + 1) * size - now)
end

-- Time until sub-window `at` stops counting.
local function frees(s, a, now, at)
  return (at + a.param + 1) * s.size - now
end

-- Consumes `cost` units in the current sub-window; returns remaining, reset.
function sliding_window.take(key, now, a, s, member)
  redis.call('HINCRBY', key, field(s.current), a.cost)
  redis.call('PEXPIRE', key, math.ceil((a.window + s.size) / 1000) + 1)
  local first = s.current
  if #s.buckets > 0 then
    first = s.buckets[1][1]
  end
  return a.limit - s.count - a.cost, frees(s, a, now, first)
end

-- Reports without consuming: remaining, reset, retry_after (exact: the time
-- until enough sub-windows stop counting).
function sliding_window.report(key, now, a, s)
  if s.count == 0 then
    return a.limit, 0, 0
  end
  local retry = 0
  if s.count + a.cost > a.limit then
    local left = s.count
    for _, bucket in ipairs(s.buckets) do
      left = left - bucket[2]
      if left + a.cost <= a.limit then
        retry = frees(s, a, now, bucket[1])
        break
      end
    end
  end
  return math.max(a.limit - s.count, 0), frees(s, a, now, s.buckets[1][1]), retry
end

-- Gives back `cost` units taken at time `taken`.
function sliding_window.refund(key, a, member, taken)
  local f = field(index(taken, a.window / a.param))
  if redis.call('HINCRBY', key, f, -a.cost) <= 0 then
    redis.call('HDEL', key, f)
  end
end
