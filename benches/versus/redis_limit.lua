-- nginx + Lua + Redis: the architecture of Kong's and APISIX's Redis-backed
-- limits (a cosocket to Redis from access_by_lua, connections kept alive in
-- the worker's pool, one script call per request), running sluice's own
-- decide script (sliding_log) on the same Redis. Used by benches/versus.rs.
--
-- init_by_lua_block { redis_limit = require "redis_limit"
--                     redis_limit.configure { port = 6379, sha = "...", ... } }
-- access_by_lua_block { redis_limit.check() }
local M = {}
local conf
local sequence = 0

function M.configure(c)
  conf = c
end

local function bulk(s)
  return "$" .. #s .. "\r\n" .. s .. "\r\n"
end

function M.check()
  local key = conf.prefix .. (ngx.var.http_x_key or "")
  sequence = sequence + 1
  local member = string.format("%x-%x", ngx.worker.pid(), sequence)
  -- EVALSHA sha 1 key member take 0 | algorithm limit window_us cost param shadow
  local args = { "EVALSHA", conf.sha, "1", key, member, "take", "0",
                 "1", conf.limit, conf.window_us, "1", "0", "0" }
  local parts = { "*" .. #args .. "\r\n" }
  for i = 1, #args do
    parts[i + 1] = bulk(args[i])
  end

  local sock = ngx.socket.tcp()
  sock:settimeouts(conf.timeout_ms, conf.timeout_ms, conf.timeout_ms)
  local ok, err = sock:connect("127.0.0.1", conf.port)
  if not ok then
    ngx.log(ngx.ERR, "redis connect: ", err)
    return ngx.exit(500)
  end
  local _, send_err = sock:send(parts)
  if send_err then
    ngx.log(ngx.ERR, "redis send: ", send_err)
    return ngx.exit(500)
  end
  local header, read_err = sock:receive("*l")
  if not header or header:sub(1, 1) ~= "*" then
    ngx.log(ngx.ERR, "redis reply: ", header or read_err)
    return ngx.exit(500)
  end
  local admitted
  for i = 1, tonumber(header:sub(2)) do
    local line = sock:receive("*l")
    if i == 1 then
      admitted = line == ":1"
    end
  end
  sock:setkeepalive(10000, 128)
  if not admitted then
    return ngx.exit(429)
  end
end

return M
