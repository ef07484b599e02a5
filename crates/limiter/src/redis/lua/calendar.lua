-- calendar: one counter per civil period (a day, week or month in a time zone;
-- docs/algorithms.md). Redis has no time zones, so the gateway sends the
-- periods around its own clock: a.window = the end of the period it is in
-- (µs), a.bounds = '<that period's start>:<the next period's end>'. Redis's
-- clock picks the period: gateways whose clocks disagree near midnight still
-- count each request in the period Redis says it is in.
-- The key is a hash like fixed_window's: w = the period's end (µs), c = units.
local calendar = {}

-- The end of the period holding time `t`, and the latest end the bounds know.
local function period_end(t, a)
  local start, after = string.match(a.bounds, '^(%d+):(%d+)$')
  start, after = tonumber(start), tonumber(after)
  if start == nil then
    error('calendar: malformed period bounds')
  end
  if t < start then
    return start, after
  elseif t < a.window then
    return a.window, after
  elseif t < after then
    return after, after
  end
  error('calendar: the gateway clock is more than a period away from Redis TIME')
end

-- Counts in the period Redis's clock is in, or in the stored later one of
-- the bounds' periods if the clock stepped back from it (clock.lua).
function calendar.peek(key, now, a)
  local ends, latest = period_end(now, a)
  local stored = redis.call('HMGET', key, 'w', 'c')
  local w = tonumber(stored[1])
  ends = counted_window(ends, w, latest)
  local count = 0
  if w == ends then
    count = tonumber(stored[2]) or 0
  end
  return count + a.cost <= a.limit, { count = count, current = ends, ends = ends }
end

-- Taking and reporting are fixed_window's, with the period's end as its index.
calendar.take = fixed_window.take
calendar.report = fixed_window.report

function calendar.refund(key, a, member, taken)
  if tonumber(redis.call('HGET', key, 'w')) == (period_end(taken, a)) then
    redis.call('HINCRBY', key, 'c', -a.cost)
  end
end
