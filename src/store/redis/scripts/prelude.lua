-- Prelude of every Meridian script (concatenated in front at build time).
--
-- KEYS[1]  the key prefix `mr:{<rule>:<key>}`. Every key a script touches is this
--          prefix plus a suffix, so all share one hash tag and one Cluster slot.
--          Suffixes are derived here because some (the window index) depend on
--          the time, which only the script knows when it reads TIME.
-- ARGV[1]  now in µs since the Unix epoch, or "" for the Redis server clock
-- ARGV[2]  cost            ARGV[3] limit        ARGV[4] period µs
-- ARGV[5]  tick µs         ARGV[6] unit         ARGV[7] refill
-- ARGV[8]  capacity        ARGV[9] ttl floor µs
--          (tick/unit/refill/capacity: see src/algorithm/params.rs)
-- Returns {allowed (0|1), limit, remaining, reset_after µs, retry_after µs, delay µs}.
--
-- Lua numbers are doubles: exact for integers below 2^53, which the Rust side
-- guarantees for every intermediate. But tostring() keeps only 14 digits, so
-- every number handed back to Redis goes through int() (%d).
local prefix = KEYS[1]
local now = tonumber(ARGV[1])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local cost = tonumber(ARGV[2])
local limit = tonumber(ARGV[3])
local period = tonumber(ARGV[4])
local tick_us = tonumber(ARGV[5])
local unit = tonumber(ARGV[6])
local refill = tonumber(ARGV[7])
local capacity = tonumber(ARGV[8])
local ttl_floor = tonumber(ARGV[9])

local function int(n)
  return string.format('%d', n)
end

local function ceil_div(a, b)
  return math.floor((a + b - 1) / b)
end

-- µs from now until the start of tick `tick`, never negative.
local function until_tick(tick)
  return math.max(0, tick * tick_us - now)
end

-- Keep `key` for `keep_us` (at least the floor, at least 1 ms).
local function expire(key, keep_us)
  redis.call('PEXPIRE', key, int(ceil_div(math.max(keep_us, ttl_floor), 1000)))
end
