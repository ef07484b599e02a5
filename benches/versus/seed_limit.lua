-- The seed's sliding-window limiter, as first written for sluice and as
-- tutorials and Kong's and APISIX's users write it: one script call per
-- decision, with the caller's clock.
--
-- KEYS[1]: the limit's key (a sorted set of admit times)
-- ARGV[1]: now, in milliseconds (the caller's clock)
-- ARGV[2]: the window, in milliseconds
-- ARGV[3]: requests allowed in the window
-- ARGV[4]: a unique member for this request
-- Returns 1 (allowed) or 0 (denied).
local key = KEYS[1]
local now = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
local max_permits = tonumber(ARGV[3])
local member = ARGV[4]
-- Drop the entries that left the window.
redis.call('ZREMRANGEBYSCORE', key, 0, now - window)
local current_requests = redis.call('ZCARD', key)
if current_requests < max_permits then
  redis.call('ZADD', key, now, member)
  -- The key outlives the window by a second, so that it never stays forever.
  redis.call('EXPIRE', key, math.ceil(window / 1000) + 1)
  return 1
else
  return 0
end
