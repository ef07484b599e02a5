-- sluice decide: runs the algorithms above over one or more keys, all or nothing.
--
-- One decision:
-- KEYS[i]: counter key of limit i.
-- ARGV[1]: unique member for this request (gateway instance id + sequence).
-- ARGV[2]: 'take' to decide, 'refund' to give back what ARGV[1] took at time
--          ARGV[3] (cluster refunds, and releasing concurrency leases), 'add'
--          to consume each limit's cost whatever it holds (a counted
--          response of a deferred limit, after its request was admitted),
--          'peek' to report without consuming (the usage API), 'reset' to
--          delete the keys and their penalty boxes.
-- ARGV[4 + 6(i-1) ..]: algorithm, limit, window (µs), cost, param, mode of
--          limit i. param: buckets (sliding_window), burst (token_bucket),
--          lease µs (concurrency), '<start>:<next end>' (calendar, whose
--          window is the end of its period, µs since the epoch).
--          mode = shadow + 2 deferred + 4 block: shadow (1) counts and
--          reports, never denies; deferred (2) checks without consuming
--          (the response decides, with 'add'); block µs > 0 is the penalty box (`block_for`): once this limit denies the key,
--          it denies it for that long whatever the count, held at
--          KEYS[i] .. '!b'.
--
-- A batch of decisions (concurrent requests of one gateway, in one call),
-- with each distinct limit sent once: ARGV[1] = '+' or '+<deadline>' (never
-- a member; the deadline in Redis's µs, see below),
-- ARGV[2] = the number of distinct limits S, then S × 6 arguments (a limit's
-- six, as above), then the number of decisions D, then per decision a head
-- and its limits' indices (1-based, into the S): head `k` for a 'take' of k
-- limits that needs no member (no concurrency limit, no sorted-set log),
-- else `k:op:taken` followed, after the indices, by the member. KEYS holds
-- every decision's keys, in order. The decisions run one after the other,
-- exactly as separate calls would, with one clock reading. The reply is one
-- string: a line with `now`, then a line per decision: its reply's numbers
-- but `now`, separated by spaces, or `!` and that decision's error (one
-- foreign key fails its own decision, not the batch). One string costs the
-- gateway one value to parse instead of six per decision.
--
-- A batch with a deadline that Redis runs after it (a stall: the gateway gave
-- up on it and answered by on_error) changes nothing and answers `~` for
-- every decision: what the gateway told its clients stands, whatever the
-- stall's length, with no refund to send and no reply needed.
--
-- The clock is Redis's own (TIME), never the gateway's. The request is admitted
-- if every non-shadow limit admits it; then each limit that admits it consumes
-- (a shadow limit that would deny consumes nothing, as if enforced). A denied
-- request consumes nothing anywhere.
--
-- Returns {admitted, now, then per key: allowed, remaining, reset_us,
-- retry_after_us}: `allowed` says whether this limit alone admits the request
-- (an allowed limit with a retry_after admits it after that wait: a delay),
-- `reset` the time until the limit frees a unit, `retry_after` the time until
-- this limit alone would admit this request (0 if it would now).
local algorithms = { sliding_log, sliding_window, fixed_window, token_bucket, concurrency, calendar }
-- Set by `run` for each call: the clock (Redis's), and the call's keys and
-- arguments (KEYS and ARGV above). A script gets them as the globals KEYS and
-- ARGV; a Redis Function gets them as parameters, and may not call Redis
-- while its library loads.
local now, call_keys, call_args

-- Whether `key` holds what one of sluice's algorithms writes: a member-scored
-- zset (sliding_log, concurrency), a number (token_bucket), or a hash of
-- sub-window counters or {w, c} (sliding_window, fixed_window).
local function left_by_sluice(key)
  local kind = redis.call('TYPE', key).ok
  if kind == 'zset' then
    local first = redis.call('ZRANGE', key, 0, 0)[1]
    return first == nil or first == '!' or string.find(first, '^%x+%-%x+') ~= nil
  elseif kind == 'string' then
    return tonumber(redis.call('GET', key)) ~= nil
  elseif kind == 'hash' then
    for _, f in ipairs(redis.call('HKEYS', key)) do
      if tonumber(f) == nil and f ~= 'w' and f ~= 'c' then
        return false
      end
    end
    return true
  end
  return false
end

-- A key of another type left by another of sluice's algorithms (a reload
-- changed the limit's algorithm) is dropped and the limit starts afresh,
-- instead of every decision on it failing with WRONGTYPE until it expires.
-- Anything else at the key is left alone and the error goes to the gateway
-- (its on_error applies). pcall costs nothing when the key is right.
local function peek(key, a)
  local ok, fit, state = pcall(a.algorithm.peek, key, now, a)
  if ok then
    return fit, state
  end
  local message = type(fit) == 'table' and fit.err or tostring(fit)
  -- A packed log lives at its own key: the value at KEY (a sorted set an
  -- earlier version may still be using) is not its to drop.
  if not string.find(message, 'WRONGTYPE', 1, true) or sliding_log.packed(a)
      or not left_by_sluice(key) then
    error(fit)
  end
  redis.call('DEL', key)
  return a.algorithm.peek(key, now, a)
end

-- Tables reused from one decision to the next (decisions run one at a time
-- and every field is written before it is read): a batch of 64 decisions
-- would otherwise allocate a few hundred small tables for the collector.
local limit_pool, fit_pool, state_pool, boxed_pool, wait_pool = {}, {}, {}, {}, {}

-- The penalty box of `key`: its own key, in the same slot (after the tag).
local function box_of(key)
  return key .. '!b'
end

-- Limit `a` (a table, reused) from its six arguments at ARGV[b ..].
local function parse_limit(a, b)
  a.algorithm = algorithms[tonumber(call_args[b])]
  a.limit = tonumber(call_args[b + 1])
  a.window = tonumber(call_args[b + 2])
  a.cost = tonumber(call_args[b + 3])
  a.param = tonumber(call_args[b + 4])
  a.bounds = call_args[b + 4]
  -- The mode is a number, or 'mode:max_delay' for a limit that delays
  -- (`on_limit: delay`): a request that would fit within max_delay µs
  -- reserves its units at the time they free and is admitted with that
  -- wait as its retry_after.
  local mode = tonumber(call_args[b + 5])
  a.delay = 0
  if mode == nil then
    local m, d = string.match(call_args[b + 5], '^(%d+):(%d+)$')
    mode, a.delay = tonumber(m), tonumber(d)
  end
  a.shadow = mode % 2 == 1
  a.deferred = math.floor(mode / 2) % 2 == 1
  a.block = math.floor(mode / 4)
  return a
end

-- One decision over KEYS[ko + 1 .. ko + n] and `limits` (n of them): `op`
-- ('take', 'refund', 'add', 'peek', 'reset') for `member`, which took its
-- units at `taken` (a refund).
local function decide_limits(ko, n, member, op, taken, limits)
  if op == 'refund' then
    for i = 1, n do
      limits[i].algorithm.refund(call_keys[ko + i], limits[i], member, taken, now)
    end
    return { 1 }
  end

  if op == 'reset' then
    for i = 1, n do
      local key = call_keys[ko + i]
      redis.call('DEL', key, box_of(key), key .. '!l', key .. '!h')
    end
    return { 1 }
  end

  -- 'peek' reports as 'take' would, consuming nothing and boxing nobody.
  local peeking = op == 'peek'

  if op == 'add' then
    for i = 1, n do
      local key = call_keys[ko + i]
      local _, state = peek(key, limits[i])
      limits[i].algorithm.take(key, now, limits[i], state, member)
    end
    return { 1 }
  end

  local fits = fit_pool
  local states = state_pool
  local boxed = boxed_pool
  local waits = wait_pool
  local admit = 1
  for i = 1, n do
    local a = limits[i]
    boxed[i] = 0
    waits[i] = 0
    if a.block > 0 then
      local left = redis.call('PTTL', box_of(call_keys[ko + i]))
      if left > 0 then
        boxed[i] = left * 1000
      end
    end
    if boxed[i] > 0 then
      fits[i] = false
    else
      fits[i], states[i] = peek(call_keys[ko + i], a)
      if not fits[i] and a.delay > 0 and not peeking then
        local wait = a.algorithm.wait(call_keys[ko + i], now, a, states[i])
        if wait ~= nil and wait <= a.delay then
          fits[i] = true
          waits[i] = wait
        end
      end
    end
    if not fits[i] and not a.shadow then
      admit = 0
    end
  end

  local out = { admit, now }
  for i = 1, n do
    local a = limits[i]
    local key = call_keys[ko + i]
    local remaining, reset, retry
    if boxed[i] > 0 then
      remaining, reset, retry = 0, boxed[i], boxed[i]
    elseif admit == 1 and fits[i] and not a.deferred and not peeking then
      if waits[i] > 0 then
        -- Admitted after a wait: allowed, with the wait as retry_after.
        remaining, reset = a.algorithm.reserve(key, now, a, states[i], member)
        retry = waits[i]
      else
        remaining, reset = a.algorithm.take(key, now, a, states[i], member)
        retry = 0
      end
    else
      remaining, reset, retry = a.algorithm.report(key, now, a, states[i])
      if not fits[i] and a.block > 0 and not peeking then
        -- This limit denied the key: into the penalty box.
        redis.call('SET', box_of(key), '1', 'PX', math.ceil(a.block / 1000))
        retry = math.max(retry, a.block)
        reset = math.max(reset, a.block)
      end
    end
    out[#out + 1] = fits[i] and 1 or 0
    out[#out + 1] = remaining
    out[#out + 1] = reset
    out[#out + 1] = retry
  end
  return out
end

-- One decision in the single form: KEYS[ko + 1 .. ko + n], its arguments
-- from ARGV[o + 1] (member, op, taken, then six per limit).
local function decide(ko, n, o)
  local limits = limit_pool
  for i = 1, n do
    limits[i] = parse_limit(limits[i] or {}, o + 4 + 6 * (i - 1))
  end
  return decide_limits(ko, n, call_args[o + 1], call_args[o + 2], tonumber(call_args[o + 3]), limits)
end

-- Renewal of the concurrency leases one gateway holds (ARGV[1] = '~', never
-- a member): per lease i, KEYS[i] and ARGV[2 + 3(i-1) ..]: its member, its
-- `lease` (µs) and its cost. A lease still held ends `lease` from now; one
-- released or already ended stays so (nothing is admitted here). A key this
-- node does not serve, or of another type, is skipped. Returns the number of
-- leases renewed.
local function renew(o)
  local renewed = 0
  for i = 1, #call_keys do
    local key = call_keys[i]
    local b = o + 3 * (i - 1)
    local member, lease, cost = call_args[b + 1], tonumber(call_args[b + 2]), tonumber(call_args[b + 3])
    local ok, score = pcall(redis.call, 'ZSCORE', key, member)
    if ok and score and tonumber(score) > now then
      local ends = now + lease
      redis.call('ZADD', key, 'XX', ends, member)
      for j = 2, cost do
        redis.call('ZADD', key, 'XX', ends, member .. '.' .. j)
      end
      local ttl = math.ceil(lease / 1000) + 1
      if redis.call('PTTL', key) < ttl then
        redis.call('PEXPIRE', key, ttl)
      end
      renewed = renewed + 1
    end
  end
  return renewed
end

-- A decision's line is formatted in one call: '%d %d …' for its numbers.
local formats = {}
local function line_format(count)
  local format = string.rep('%d ', count - 1) .. '%d'
  formats[count] = format
  return format
end

-- The common decision, with the fewest calls: one limit, 'take', cost 1, no
-- shadow, deferral, penalty box or delay, on any algorithm but calendar
-- (`a.fast`, set when the batch's limits are read). Returns the decision's
-- line; nil, having written nothing the general path would not, for
-- anything else (a denial some algorithms leave to it): the general path
-- then takes it, as it takes a decision whose key holds another type (the
-- error is raised before anything is written). Each algorithm's fast
-- function makes the line its own peek, take and report would (a test
-- holds the two paths in step); what it saves is the general path's tables,
-- protected calls and the commands a common decision does not need.
local function fast(key, a, member)
  local algorithm = a.algorithm
  if algorithm == sliding_log then
    if sliding_log.packed(a) then
      return sliding_log.fast_packed(key, now, a)
    end
    return sliding_log.fast_zset(key, now, a, member)
  elseif algorithm == fixed_window then
    return fixed_window.fast(key, now, a)
  elseif algorithm == sliding_window then
    return sliding_window.fast(key, now, a)
  elseif algorithm == token_bucket then
    return token_bucket.fast(key, now, a)
  end
  return concurrency.fast(key, now, a, member)
end

-- Limits read once per batch (their tables reused from one call to the next).
local spec_pool = {}

-- The batch's distinct limits, from ARGV[first + 1] (their count) on;
-- returns them and the index of the argument after them.
local function read_specs(first)
  local count = tonumber(call_args[first + 1])
  local specs = spec_pool
  for j = 1, count do
    local b = first + 2 + 6 * (j - 1)
    local a = parse_limit(specs[j] or {}, b)
    a.fast = call_args[b + 5] == '0' and a.cost == 1 and a.algorithm ~= calendar
    specs[j] = a
  end
  return specs, first + 2 + 6 * count
end

-- A batch in the compact form (see the top of this file).
local function run_batch(first)
  local deadline = tonumber(string.sub(call_args[first], 2))
  if deadline ~= nil and now > deadline then
    local count = tonumber(call_args[first + 2 + 6 * tonumber(call_args[first + 1])])
    return string.format('%d', now) .. string.rep('\n~', count)
  end
  local specs, o = read_specs(first)
  local lines = { string.format('%d', now) }
  local limits = limit_pool
  local ko = 0
  for d = 1, tonumber(call_args[o]) do
    o = o + 1
    local head = call_args[o]
    local n = tonumber(head)
    local op, taken, member = 'take', 0, nil
    if n == nil then
      local k, p, t = string.match(head, '^(%d+):(%a+):(%-?%d+)$')
      n, op, taken = tonumber(k), p, tonumber(t)
      member = call_args[o + n + 1]
    end
    for i = 1, n do
      limits[i] = specs[tonumber(call_args[o + i])]
    end
    local line = nil
    if n == 1 and op == 'take' and limits[1].fast then
      local ok, fast_line = pcall(fast, call_keys[ko + 1], limits[1], member)
      if ok then
        line = fast_line
      end
    end
    if line == nil then
      local ok, reply = pcall(decide_limits, ko, n, member, op, taken, limits)
      if ok then
        local count = #reply
        -- Its numbers but `now` (the batch's first line).
        table.remove(reply, 2)
        line = string.format(formats[count - 1] or line_format(count - 1), unpack(reply))
      else
        local message = type(reply) == 'table' and reply.err or tostring(reply)
        line = '!' .. string.gsub(message, '\n', ' ')
      end
    end
    lines[d + 1] = line
    ko = ko + n
    o = o + n + (member and 1 or 0)
  end
  return table.concat(lines, '\n')
end

-- One call: a single decision, or a batch (ARGV[1] = '*'). Either may come
-- with its keys as arguments instead of KEYS: ARGV[1] = '@', ARGV[2] = the
-- key count k, ARGV[3 .. k + 2] the keys, then the call's arguments as above.
-- A Redis Cluster node's batch does so: its keys lie in many slots of that
-- node, and declared keys must share one slot.
local function run(keys, argv)
  call_keys, call_args = keys, argv
  local first = 1
  if argv[1] == '@' then
    local k = tonumber(argv[2])
    local carried = {}
    for i = 1, k do
      carried[i] = argv[2 + i]
    end
    call_keys = carried
    first = 3 + k
  end
  local t = redis.call('TIME')
  now = t[1] * 1000000 + t[2]
  if call_args[first] == '~' then
    return renew(first)
  end
  if string.byte(call_args[first], 1) == 43 then -- '+'
    return run_batch(first)
  end
  return decide(0, #call_keys, first - 1)
end
