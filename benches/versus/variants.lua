#!lua name=versus_variants
-- Reference variants for `--parts redis`: the least a batch call of an exact
-- log could do, each a bare minimum (no header, no clock-step rule, no
-- refunds, an answer of one digit), to show where the ceiling of a
-- decision per Redis core lies. Not sluice's code. KEYS: the batch's keys;
-- ARGV: limit, window (µs), a member prefix. The reply: Redis's time, then
-- a line per key, 1 (admitted) or 0.
local function now_us()
  local t = redis.call('TIME')
  return t[1] * 1000000 + t[2]
end

-- The batch call alone: no command per decision.
local function nocall(keys, args)
  local lines = { tostring(now_us()) }
  for i = 1, #keys do
    lines[i + 1] = '1'
  end
  return table.concat(lines, '\n')
end

-- Packed stamps in a string (8-byte base, 6-byte offsets): GET (or one MGET
-- for the batch), the limit-th newest stamp read, APPEND.
local function packed(keys, args, together)
  local now = now_us()
  local limit, window = tonumber(args[1]), tonumber(args[2])
  local lines = { tostring(now) }
  local values = together and redis.call('MGET', unpack(keys))
  for i = 1, #keys do
    local key = keys[i]
    local raw = together and values[i] or redis.call('GET', key)
    local admitted = false
    if not raw then
      redis.call('SET', key, struct.pack('>lI6', now, 0), 'PX', math.floor(window * 1.5 / 1000))
      admitted = true
    else
      local n = (#raw - 8) / 6
      local base = struct.unpack('>l', raw)
      if n < limit or base + struct.unpack('>I6', raw, 8 + 6 * (n - limit) + 1) <= now - window then
        redis.call('APPEND', key, struct.pack('>I6', now - base))
        admitted = true
      end
    end
    lines[i + 1] = admitted and '1' or '0'
  end
  return table.concat(lines, '\n')
end

-- A list of stamps: LINDEX of the limit-th newest, RPUSH, PEXPIRE.
local function list(keys, args)
  local now = now_us()
  local limit, window = tonumber(args[1]), tonumber(args[2])
  local lines = { tostring(now) }
  for i = 1, #keys do
    local key = keys[i]
    local at = redis.call('LINDEX', key, -limit)
    local admitted = not at or tonumber(at) <= now - window
    if admitted then
      redis.call('RPUSH', key, now)
      redis.call('PEXPIRE', key, math.floor(window / 1000))
    end
    lines[i + 1] = admitted and '1' or '0'
  end
  return table.concat(lines, '\n')
end

-- The seed's four sorted-set commands, in one batch call.
local function sorted(keys, args)
  local now = now_us()
  local limit, window = tonumber(args[1]), tonumber(args[2])
  local lines = { tostring(now) }
  for i = 1, #keys do
    local key = keys[i]
    redis.call('ZREMRANGEBYSCORE', key, '-inf', now - window)
    local admitted = redis.call('ZCARD', key) < limit
    if admitted then
      redis.call('ZADD', key, now, args[3] .. '-' .. now .. '-' .. i)
      redis.call('PEXPIRE', key, math.floor(window / 1000))
    end
    lines[i + 1] = admitted and '1' or '0'
  end
  return table.concat(lines, '\n')
end

local flags = { 'allow-cross-slot-keys' }
redis.register_function { function_name = 'v_nocall', callback = nocall, flags = flags }
redis.register_function { function_name = 'v_packed', callback = function(k, a) return packed(k, a, false) end, flags = flags }
redis.register_function { function_name = 'v_mget', callback = function(k, a) return packed(k, a, true) end, flags = flags }
redis.register_function { function_name = 'v_list', callback = list, flags = flags }
redis.register_function { function_name = 'v_sorted', callback = sorted, flags = flags }
