-- nginx + Lua + Redis: the architecture of Kong's and APISIX's Redis-backed
-- limits (a cosocket to Redis from access_by_lua, connections kept alive in
-- the worker's pool, one script call per request). It runs either the
-- seed's sliding-window script (`seed_limit.lua`: what such users run) or
-- sluice's own decide script (sliding_log), on the same Redis as sluice.
-- Used by benches/versus.
--
-- init_by_lua_block { redis_limit = require "redis_limit"
--                     redis_limit.configure { port = 6379, sha = "...", seed = true, ... } }
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
  local args
  if conf.seed then
    -- EVALSHA sha 1 key now_ms window_ms limit member
    args = { "EVALSHA", conf.sha, "1", key, string.format("%d", ngx.now() * 1000),
             string.format("%d", conf.window_us / 1000), conf.limit, member }
  else
    -- EVALSHA sha 1 key member take 0 | algorithm limit window_us cost param shadow
    args = { "EVALSHA", conf.sha, "1", key, member, "take", "0",
             "1", conf.limit, string.format("%d", conf.window_us), "1", "0", "0" }
  end
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
  local admitted
  if header and conf.seed and header:sub(1, 1) == ":" then
    -- The seed's script answers 1 or 0.
    admitted = header == ":1"
  elseif header and header:sub(1, 1) == "*" then
    -- sluice's answers {admitted, now, …}.
    for i = 1, tonumber(header:sub(2)) do
      local line = sock:receive("*l")
      if i == 1 then
        admitted = line == ":1"
      end
    end
  else
    ngx.log(ngx.ERR, "redis reply: ", header or read_err)
    return ngx.exit(500)
  end
  sock:setkeepalive(10000, 128)
  if not admitted then
    return ngx.exit(429)
  end
end

return M
