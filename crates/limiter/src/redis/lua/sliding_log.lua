-- sliding_log: the exact sliding-window log (docs/algorithms.md).
--
-- A log of admitted units per key; each unit is its admission time (µs), its
-- stamp. A unit stamped s counts while now - s < window, so any half-open
-- interval of length `window` holds at most `limit` units. Denied requests
-- add nothing: a key never holds more than `limit` live entries.
--
-- Stamps never go back: a unit is stamped max(now, the key's newest stamp,
-- the latest time units were dropped from it as expired), so when Redis's
-- clock steps back (NTP, a failover to a replica whose clock is behind) the
-- new units are stamped no earlier than what the log already holds or has
-- forgotten, and count at least as long as they would have. The log stays
-- exact on its own timeline, never looser. (The drop time matters once a
-- refund has removed the newest units: without it, a unit dropped at a
-- later clock reading could be followed by one stamped within its window.)
--
-- Two layouts, by the limit:
--
-- - limit <= PACKED_MAX: a string at KEY .. '!l' (the suffix keeps it apart
--   from the sorted set an earlier version kept at KEY, see below): a 24-byte
--   header — base, expiry and the last drop time (µs), 8 bytes each,
--   big-endian — then one 6-byte big-endian offset from base per unit,
--   oldest first. A decision
--   reads it with one GET; an admission APPENDs its units, and the string is
--   rewritten (one SET … PXAT) only when the key is new, when its expiry
--   would not outlive the new unit by a window, or when half of it has
--   expired; the expiry is set half a window beyond what is needed, so a
--   busy key only appends. 6 to 12 bytes per unit.
-- - larger limits: a sorted set at KEY, score = stamp, member unique per
--   request (member, member.2, … for cost > 1): past a few hundred units a
--   GET of the whole string costs more than the sorted set's commands. The
--   earliest stamp a new unit may have is the newest unit's, read with the
--   set's last member; where that is not enough (units were dropped as
--   expired by a decision that logged none, or a refund removed the newest),
--   the floor is kept in the set itself by a marker member, `!`, scored
--   MARK + floor: always the set's last member, never counted, and removed
--   by the next unit logged (whose stamp is at least the floor). So the
--   common decision reads the floor and the newest unit in one command.
local sliding_log = {}

-- The largest limit kept as a packed string.
local PACKED_MAX = 1024
local HEADER = 24
local WIDTH = 6
-- Offsets from base stay below this (2^47 µs, 4.4 years); a log that would
-- pass it is rewritten on a new base.
local MAX_OFFSET = 140737488355328

-- Whether limit `a` is kept as a packed string (at its own key).
function sliding_log.packed(a)
  return a.algorithm == sliding_log and a.limit <= PACKED_MAX
end

-- The sorted-set log's floor marker: its member, and the offset of its
-- score (2^52: stamps are µs since the epoch, about 2^51 in 2026; scores
-- stay exact doubles below 2^53).
local MARKER = '!'
local MARK = 4503599627370496

local function log_of(key)
  return key .. '!l'
end

-- The stamp of unit i (1-based) of the packed log `s`.
local function stamp_at(s, i)
  return s.base + struct.unpack('>I6', s.raw, HEADER + WIDTH * (i - 1) + 1)
end

-- The packed log at `key` read and split at the window: {raw, n units,
-- first live unit, live count, base, expiry, oldest live, newest}. A value
-- that is not a packed log (written by something else into sluice's name
-- space) is dropped and the log starts afresh.
local function read_packed(key, now, a)
  local log = log_of(key)
  local raw = redis.call('GET', log)
  if raw and (#raw < HEADER or (#raw - HEADER) % WIDTH ~= 0) then
    redis.call('DEL', log)
    raw = false
  end
  if not raw then
    return { log = log, n = 0, first = 1, count = 0, dropped = 0 }
  end
  local base, expires, dropped = struct.unpack('>lll', raw)
  local s = { log = log, raw = raw, n = (#raw - HEADER) / WIDTH, base = base, expires = expires, dropped = dropped }
  -- The first live unit: the first stamped after now - window (the log is
  -- in stamp order). Usually the oldest is still live: one read.
  local floor = now - a.window
  local lo, hi = 1, s.n + 1
  if s.n > 0 and stamp_at(s, 1) > floor then
    hi = 1
  end
  while lo < hi do
    local mid = math.floor((lo + hi) / 2)
    if stamp_at(s, mid) > floor then
      hi = mid
    else
      lo = mid + 1
    end
  end
  s.first = lo
  s.count = s.n - lo + 1
  if s.count > 0 then
    s.oldest = stamp_at(s, lo)
  end
  if s.n > 0 then
    s.newest = stamp_at(s, s.n)
  end
  return s
end

-- Logs `cost` units stamped `stamp` (>= every stamp logged) in the packed
-- log `s`: appended, or the live units rewritten with them.
local function write_packed(key, a, s, stamp)
  if s.n > 0 and s.expires >= stamp + a.window and (s.first - 1) * 2 < s.n
      and stamp - s.base < MAX_OFFSET then
    redis.call('APPEND', s.log, string.rep(struct.pack('>I6', stamp - s.base), a.cost))
    return
  end
  local base = s.base
  local body = ''
  if s.count == 0 then
    base = stamp
  elseif stamp - base < MAX_OFFSET then
    body = string.sub(s.raw, HEADER + WIDTH * (s.first - 1) + 1)
  else
    base = s.oldest
    local units = {}
    for i = s.first, s.n do
      units[#units + 1] = struct.pack('>I6', stamp_at(s, i) - base)
    end
    body = table.concat(units)
  end
  local expires = stamp + a.window + math.floor(a.window / 2)
  -- Units before `first` are dropped now: no later stamp may come before
  -- this one.
  local dropped = s.dropped
  if s.first > 1 then
    dropped = math.max(dropped, stamp)
  end
  local header = struct.pack('>lll', base, expires, dropped)
  local units = string.rep(struct.pack('>I6', stamp - base), a.cost)
  redis.call('SET', s.log, header .. body .. units, 'PXAT', digits(math.ceil(expires / 1000) + 1))
end

-- The common decision on a packed log (cost 1, `take`, plain mode), with
-- no table built: the line decide.lua's fast path answers with, admitted
-- or denied, exactly as peek + take or peek + report would make it (a test
-- holds the two in step); the state table is built only for a rewrite.
-- nil, having written nothing, for a value that is not a packed log: the
-- general path then takes it.
function sliding_log.fast_packed(key, now, a)
  local log = key .. '!l'
  local raw = redis.call('GET', log)
  local window, limit = a.window, a.limit
  if not raw then
    local expires = now + window + math.floor(window / 2)
    redis.call('SET', log, struct.pack('>lllI6', now, expires, 0, 0), 'PXAT', digits(math.ceil(expires / 1000) + 1))
    return string.format('1 1 %d %d 0', limit - 1, window)
  end
  local size = #raw
  if size < HEADER or (size - HEADER) % WIDTH ~= 0 then
    return nil
  end
  local n = (size - HEADER) / WIDTH
  local base, expires, dropped = struct.unpack('>lll', raw)
  local floor = now - window
  -- The first live unit (usually the oldest: one read).
  local lo, hi = 1, n + 1
  local oldest = n > 0 and base + struct.unpack('>I6', raw, HEADER + 1)
  if oldest and oldest > floor then
    hi = 1
  end
  while lo < hi do
    local mid = math.floor((lo + hi) / 2)
    if base + struct.unpack('>I6', raw, HEADER + WIDTH * (mid - 1) + 1) > floor then
      hi = mid
    else
      lo = mid + 1
    end
  end
  local count = n - lo + 1
  if count > 0 and lo > 1 then
    oldest = base + struct.unpack('>I6', raw, HEADER + WIDTH * (lo - 1) + 1)
  end
  if count + 1 > limit then
    -- Denied: the unit that blocks it is the (count - limit + 1)-th live.
    local blocking = base + struct.unpack('>I6', raw, HEADER + WIDTH * math.min(lo + count - limit, n) + 1 - WIDTH)
    return string.format('0 0 %d %d %d', math.max(limit - count, 0), oldest + window - now, blocking + window - now)
  end
  local newest = n > 0 and base + struct.unpack('>I6', raw, size - WIDTH + 1) or 0
  local stamp = math.max(now, newest, dropped)
  if n > 0 and expires >= stamp + window and (lo - 1) * 2 < n and stamp - base < MAX_OFFSET then
    redis.call('APPEND', log, struct.pack('>I6', stamp - base))
  else
    write_packed(key, a, {
      log = log, raw = raw, n = n, first = lo, count = count,
      base = base, expires = expires, dropped = dropped, oldest = oldest,
    }, stamp)
  end
  return string.format('1 1 %d %d 0', limit - count - 1, (count > 0 and oldest or stamp) + window - now)
end

-- The floor of the sorted-set log at `key` (the earliest stamp a new unit
-- may have: its newest unit's, or its marker's) and whether the marker is
-- there; 0 for an empty set.
local function zset_floor(key)
  local top = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  if top[1] == nil then
    return 0, false
  end
  if top[1] == MARKER then
    return tonumber(top[2]) - MARK, true
  end
  return tonumber(top[2]), false
end

-- Sets the marker of the log at `key` to `floor`, the key kept at least a
-- second (a marker matters only while the clock is behind it).
local function mark_floor(key, floor)
  redis.call('ZADD', key, MARK + floor, MARKER)
  if redis.call('PTTL', key) < 1000 then
    redis.call('PEXPIRE', key, 1000)
  end
end

-- The sorted-set log of a large limit, split at the window (expired units
-- dropped): {count, oldest, floor, marked, zset = true}. Units dropped
-- here must not be followed by a stamp within their window: if the newest
-- left is earlier than `now`, the floor is marked as `now` (the unit a
-- take logs next replaces the marker).
local function read_zset(key, now, a)
  local dropped = redis.call('ZREMRANGEBYSCORE', key, '-inf', now - a.window)
  local card = redis.call('ZCARD', key)
  local floor, marked = 0, false
  if card > 0 then
    floor, marked = zset_floor(key)
  end
  local count = card - (marked and 1 or 0)
  if dropped > 0 and floor < now then
    mark_floor(key, now)
    floor, marked = now, true
  end
  if count == 0 then
    return { zset = true, count = 0, floor = floor, marked = marked }
  end
  local oldest = tonumber(redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')[2])
  return { zset = true, count = count, oldest = oldest, floor = floor, marked = marked }
end

-- The common decision on a sorted-set log (cost 1, `take`, plain mode):
-- the line peek + take would make, from the fewest commands: the oldest
-- entry (expired ones dropped only when it is), the count, the floor from
-- the last member, then the new entry and the expiry — five commands, seven
-- with a drop, three on an empty key. A drop followed by this take needs no
-- marker: the new entry's stamp is at least `now`. A denial is left to the
-- general path (nil), the drop's floor marked first as read_zset would.
function sliding_log.fast_zset(key, now, a, member)
  local window, limit = a.window, a.limit
  local first = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
  local dropped = false
  if first[1] ~= nil and first[1] ~= MARKER and tonumber(first[2]) <= now - window then
    redis.call('ZREMRANGEBYSCORE', key, '-inf', digits(now - window))
    dropped = true
    first = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
  end
  if first[1] == nil then
    redis.call('ZADD', key, digits(now), member)
    redis.call('PEXPIRE', key, digits(math.ceil(window / 1000) + 1))
    return string.format('1 1 %d %d 0', limit - 1, window)
  end
  local card = redis.call('ZCARD', key)
  local floor, marked = zset_floor(key)
  local count = card - (marked and 1 or 0)
  if count + 1 > limit then
    if dropped and floor < now then
      mark_floor(key, now)
    end
    return nil
  end
  local stamp = math.max(now, floor)
  local oldest = stamp
  if count > 0 then
    oldest = tonumber(first[2])
  end
  redis.call('ZADD', key, digits(stamp), member)
  if marked then
    redis.call('ZREM', key, MARKER)
  end
  redis.call('PEXPIRE', key, digits(math.ceil((stamp - now + window) / 1000) + 1))
  return string.format('1 1 %d %d 0', limit - count - 1, oldest + window - now)
end

-- The stamp of the rank-th (0-based) live unit of the log `s`.
local function live_stamp(key, s, rank)
  if s.zset then
    return tonumber(redis.call('ZRANGE', key, rank, rank, 'WITHSCORES')[2])
  end
  return stamp_at(s, math.min(s.first + rank, s.n))
end

-- The earliest stamp a new unit may have: the newest logged at `key`, or
-- the last time units were dropped from it, whichever is later (0 if none).
local function newest(key, s)
  if not s.zset then
    return math.max(s.newest or 0, s.dropped)
  end
  return s.floor
end

-- Logs `cost` units stamped `stamp`, and sets the key's expiry (`now` for
-- the sorted set's relative one).
local function log_units(key, now, a, s, stamp, member)
  if not s.zset then
    write_packed(key, a, s, stamp)
    return
  end
  redis.call('ZADD', key, stamp, member)
  for j = 2, a.cost do
    redis.call('ZADD', key, stamp, member .. '.' .. j)
  end
  if s.marked then
    -- The new unit's stamp is at least the floor: it holds it now.
    redis.call('ZREM', key, MARKER)
    s.marked = false
  end
  s.floor = math.max(s.floor, stamp)
  redis.call('PEXPIRE', key, math.ceil((stamp - now + a.window) / 1000) + 1)
end

-- Returns whether `cost` more units fit, and the state.
function sliding_log.peek(key, now, a)
  local s
  if a.limit <= PACKED_MAX then
    s = read_packed(key, now, a)
  else
    s = read_zset(key, now, a)
  end
  return s.count + a.cost <= a.limit, s
end

-- Consumes `cost` units, stamped max(now, newest); returns remaining, reset.
function sliding_log.take(key, now, a, s, member)
  local stamp = math.max(now, newest(key, s))
  log_units(key, now, a, s, stamp, member)
  local first = s.count > 0 and s.oldest or stamp
  return a.limit - s.count - a.cost, first + a.window - now
end

-- Reports without consuming: remaining, reset, retry_after.
function sliding_log.report(key, now, a, s)
  if s.count == 0 then
    return a.limit, 0, 0
  end
  local retry = 0
  local excess = s.count + a.cost - a.limit
  if excess > 0 then
    retry = live_stamp(key, s, excess - 1) + a.window - now
  end
  return math.max(a.limit - s.count, 0), s.oldest + a.window - now, retry
end

-- Gives back the units a request took at `taken` (Redis time; 0: the
-- request's units are still to come, a reservation given back, so `now`):
-- the sorted set's by member; the packed log's as the `cost` oldest units
-- stamped at or after `taken`. Those are the request's own, or units logged
-- before it whose stamps are at least as late (the clock stepped back, or a
-- reservation): removing one of those instead keeps the request's later
-- stamp, never looser.
function sliding_log.refund(key, a, member, taken, now)
  if a.limit > PACKED_MAX then
    -- The floor is kept by the marker before the units go: a refund of the
    -- newest must not let a later unit be stamped under what was dropped.
    local floor = zset_floor(key)
    if floor > 0 then
      mark_floor(key, floor)
    end
    redis.call('ZREM', key, member)
    for j = 2, a.cost do
      redis.call('ZREM', key, member .. '.' .. j)
    end
    return
  end
  if taken == 0 then
    taken = now
  elseif taken <= now - a.window then
    -- Its units have left the window (and may be gone): nothing of its own
    -- to give back, and a later request's units are not its to give.
    return
  end
  local s = read_packed(key, 0, { window = 0 })
  if s.n == 0 then
    return
  end
  local lo, hi = 1, s.n + 1
  while lo < hi do
    local mid = math.floor((lo + hi) / 2)
    if stamp_at(s, mid) >= taken then
      hi = mid
    else
      lo = mid + 1
    end
  end
  if lo > s.n then
    return
  end
  local last = math.min(s.n, lo + a.cost - 1)
  local kept = string.sub(s.raw, 1, HEADER + WIDTH * (lo - 1)) .. string.sub(s.raw, HEADER + WIDTH * last + 1)
  redis.call('SET', s.log, kept, 'KEEPTTL')
end

-- For a limit that delays: the wait until `cost` more units fit, given the
-- units already admitted or reserved (some may lie in the future). The units
-- go at the time the unit that blocks them leaves the window, and never
-- before the newest stamp, so any window holds at most `limit`.
function sliding_log.wait(key, now, a, s)
  local excess = s.count + a.cost - a.limit
  if excess <= 0 or a.cost > a.limit then
    return nil
  end
  local at = live_stamp(key, s, excess - 1) + a.window
  local last = newest(key, s)
  if last > at then
    at = last
  end
  s.at = at
  return at - now
end

-- Reserves `cost` units at the time `wait` found; returns remaining, reset.
function sliding_log.reserve(key, now, a, s, member)
  log_units(key, now, a, s, s.at, member)
  return 0, s.oldest + a.window - now
end
