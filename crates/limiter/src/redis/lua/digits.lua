-- Whole numbers as Redis arguments, written by Lua's integer formatting.
-- A number handed to redis.call as it is, Redis writes with "%.17g", and a
-- reply line's '%.0f' goes the same way: glibc's exact floating-point
-- printer, several times the cost of an integer's digits. Every value sent
-- so is a whole number of µs or ms (far below 2^53), which '%d' writes
-- exactly (as a 64-bit integer).
local function digits(n)
  return string.format('%d', n)
end
