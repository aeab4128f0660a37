-- Prelude of every Meridian script (concatenated in front at build time, with
-- epilogue.lua behind the algorithm's body).
--
-- One call decides one or more checks of one limit, in order, as if each were
-- its own call: a later check on the same counter sees the earlier one's hits.
-- Standalone Redis gets many checks per call (one Lua entry, one TIME, one
-- round trip for a whole native batch or for concurrent requests); Cluster
-- only checks of one slot. The limit is sent once per call, not per check:
-- parsing arguments is a good part of a check's cost in Redis.
--
-- ARGV[1]    now in µs since the Unix epoch, or "" for the Redis server clock
-- ARGV[2]    limit           ARGV[3] period µs      ARGV[4] tick µs
-- ARGV[5]    unit            ARGV[6] refill         ARGV[7] capacity
-- ARGV[8]    ttl floor µs    (tick/unit/refill/capacity: see src/algorithm/params.rs)
-- For check i (from 1):
-- KEYS[i]    the key prefix `mr:{<rule>:<key>}`. Every key a check touches is its
--            prefix plus a suffix, so all share one hash tag and one Cluster slot.
--            Suffixes are derived here because some (the window index) depend on
--            the time, which only the script knows when it reads TIME.
-- ARGV[8+i]  cost (0 = check only)
-- Returns, per check, {allowed (0|1), limit, remaining, reset_after µs,
-- retry_after µs, delay µs}, all flattened into one array (6 integers a check).
--
-- Lua numbers are doubles: exact for integers below 2^53, which the Rust side
-- guarantees for every intermediate. But tostring() keeps only 14 digits, so
-- every number handed back to Redis goes through int() (%d).

local function int(n)
  return string.format('%d', n)
end

local function ceil_div(a, b)
  return math.floor((a + b - 1) / b)
end

-- TIME is read at most once per call: every check of a call happens at the
-- same instant, and a redis.call costs about as much as the check's own logic.
local now = tonumber(ARGV[1])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local limit = tonumber(ARGV[2])
local period = tonumber(ARGV[3])
local tick_us = tonumber(ARGV[4])
local unit = tonumber(ARGV[5])
local refill = tonumber(ARGV[6])
local capacity = tonumber(ARGV[7])
local ttl_floor = tonumber(ARGV[8])
-- Set by multi.lua's first round: decide exactly as a real call would, but
-- write nothing that charges a hit (an algorithm may still persist what a
-- denial would: a bucket's rescaled level).
local dry = false

-- µs from now until the start of tick `tick`, never negative.
local function until_tick(tick)
  return math.max(0, tick * tick_us - now)
end

-- Keep `key` for `keep_us` (at least the floor, at least 1 ms).
local function expire(key, keep_us)
  redis.call('PEXPIRE', key, int(ceil_div(math.max(keep_us, ttl_floor), 1000)))
end

-- The algorithm's body follows; it returns this check's six integers.
local function decide(prefix, cost)
