-- Counters on a clock that steps back, shared by the counting algorithms below.
--
-- When Redis's clock steps back (NTP, a failover to a replica whose clock is
-- behind), a counter never starts counting in a window earlier than the
-- newest one it already counts in: that window stays the current one until
-- the clock reaches it again, so nothing it counted is forgotten and nothing
-- is admitted twice. A stored window further ahead of the clock than a step
-- back could put it was written under another window size (a reload): it is
-- not counted, as before.
local CLOCK_STEP_BACK_MAX = 3600000000

-- The window to count in: `current` (the clock's), or `stored` when it is
-- ahead of the clock by no more than `latest` allows (a step back).
local function counted_window(current, stored, latest)
  if stored ~= nil and stored > current and stored <= latest then
    return stored
  end
  return current
end

-- The latest window index of size `size` (µs) a step back can leave ahead of
-- window `current`.
local function latest_after_step_back(current, size)
  return current + math.floor(CLOCK_STEP_BACK_MAX / size)
end
