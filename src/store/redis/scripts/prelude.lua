-- Prelude of every Meridian script (concatenated in front at build time, with
-- epilogue.lua behind the algorithm's body).
--
-- One call decides one or more checks, in order, as if each were its own call:
-- a later check on the same counter sees the earlier one's hits. Standalone
-- Redis gets many checks per call (one Lua entry, one TIME, one round trip for
-- a whole native batch or for concurrent requests); Cluster one per call,
-- since a script's keys must share a slot.
--
-- For check i (from 1), with o = (i - 1) * 9:
-- KEYS[i]    the key prefix `mr:{<rule>:<key>}`. Every key a check touches is its
--            prefix plus a suffix, so all share one hash tag and one Cluster slot.
--            Suffixes are derived here because some (the window index) depend on
--            the time, which only the script knows when it reads TIME.
-- ARGV[o+1]  now in µs since the Unix epoch, or "" for the Redis server clock
-- ARGV[o+2]  cost            ARGV[o+3] limit        ARGV[o+4] period µs
-- ARGV[o+5]  tick µs         ARGV[o+6] unit         ARGV[o+7] refill
-- ARGV[o+8]  capacity        ARGV[o+9] ttl floor µs
--            (tick/unit/refill/capacity: see src/algorithm/params.rs)
-- Returns, per check, {allowed (0|1), limit, remaining, reset_after µs,
-- retry_after µs, delay µs}, all flattened into one array (6 integers a check).
--
-- Lua numbers are doubles: exact for integers below 2^53, which the Rust side
-- guarantees for every intermediate. But tostring() keeps only 14 digits, so
-- every number handed back to Redis goes through int() (%d).

-- TIME is read at most once per call: every check of a call happens at the
-- same instant, and a redis.call costs about as much as the check's own logic.
local server_now
local function clock(arg)
  local n = tonumber(arg)
  if n then
    return n
  end
  if not server_now then
    local t = redis.call('TIME')
    server_now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  end
  return server_now
end

local function int(n)
  return string.format('%d', n)
end

local function ceil_div(a, b)
  return math.floor((a + b - 1) / b)
end

local out, filled = {}, 0
for i = 1, #KEYS do
  local o = (i - 1) * 9
  local prefix = KEYS[i]
  local now = clock(ARGV[o + 1])
  local cost = tonumber(ARGV[o + 2])
  local limit = tonumber(ARGV[o + 3])
  local period = tonumber(ARGV[o + 4])
  local tick_us = tonumber(ARGV[o + 5])
  local unit = tonumber(ARGV[o + 6])
  local refill = tonumber(ARGV[o + 7])
  local capacity = tonumber(ARGV[o + 8])
  local ttl_floor = tonumber(ARGV[o + 9])

  -- µs from now until the start of tick `tick`, never negative.
  local function until_tick(tick)
    return math.max(0, tick * tick_us - now)
  end

  -- Keep `key` for `keep_us` (at least the floor, at least 1 ms).
  local function expire(key, keep_us)
    redis.call('PEXPIRE', key, int(ceil_div(math.max(keep_us, ttl_floor), 1000)))
  end

  -- The algorithm's body follows; its `return {...}` is this check's decision.
  local decision = (function()
