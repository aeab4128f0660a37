-- Clears counters (src/store/redis/clear.rs): deletes every state key the
-- check scripts (and approximate_flush.lua) may have written under each
-- prefix, whatever the algorithm. Without the prelude: it decides nothing.
--
-- KEYS[i]  a counter prefix `mr:{<rule>:<key>}` (limit j > 0 of a `limits:`
--          rule: `mr:{<rule>:<key>}:<j>`). On a Cluster the caller groups
--          prefixes by slot, so every KEYS entry shares one slot.
-- ARGV[1]  now in µs, or "" for the Redis server clock (the one the check
--          scripts read, so the windows named here are the windows they use)
-- ARGV[2…] the periods, µs, a windowed counter of these prefixes may have
--          been counted in (each limit's, and those of descriptor overrides)
-- Returns  {how many keys existed and were deleted}.
--
-- Names, not a SCAN: a SCAN walks the whole keyspace of a node (millions of
-- keys), while every name here follows from the prefix and the clock:
--   sliding log     <prefix>:sl and its sequence <prefix>:sl:seq
--   token bucket    <prefix>:tb        leaky bucket  <prefix>:lb
--   fixed window    <prefix>:fw:<w>    sliding counter <prefix>:sc:<w>
-- for the windows w - 1, w and w + 1 of every period: w is the one checks
-- count in now; w - 1 is still read by the sliding counter (and may still
-- hold a fixed window's count under a TTL floor); w + 1 is where a pod on
-- the approximate path, whose estimate of this clock runs a little ahead,
-- may already have flushed near the boundary. Older windows are read by no
-- check and expire by their TTL. The flush ids (`<prefix>:f:<id>`) are not
-- counters: deleting one would let a resent flush count twice.

local function int(n)
  return string.format('%d', n)
end

local now = tonumber(ARGV[1])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end

local deleted = 0
local names = {}
-- DEL in chunks: unpack() of a long list would overflow Lua's C stack.
local function flush()
  if #names > 0 then
    deleted = deleted + redis.call('DEL', unpack(names))
    names = {}
  end
end
local function add(name)
  names[#names + 1] = name
  if #names >= 200 then
    flush()
  end
end

for i = 1, #KEYS do
  local prefix = KEYS[i]
  add(prefix .. ':sl')
  add(prefix .. ':sl:seq')
  add(prefix .. ':tb')
  add(prefix .. ':lb')
  for a = 2, #ARGV do
    local window = math.floor(now / tonumber(ARGV[a]))
    for w = window - 1, window + 1 do
      add(prefix .. ':fw:' .. int(w))
      add(prefix .. ':sc:' .. int(w))
    end
  end
end
flush()
-- A one-element array: every script reply is read as a list of integers.
return {deleted}
