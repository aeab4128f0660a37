-- sliding_window_log: a sorted set of hit timestamps (src/algorithm/sliding_log.rs).
-- Members must be distinct, so they are numbered from a counter kept beside the set.
local key = prefix .. ':sl'
local seq_key = prefix .. ':sl:seq'
redis.call('ZREMRANGEBYSCORE', key, '-inf', int(now - period))
local count = redis.call('ZCARD', key)
local allowed, retry = 0, 0
if count + cost <= limit and (cost == 0 or dry) then
  -- A check-only peek, or multi.lua's first round: nothing to write.
  allowed = 1
elseif count + cost <= limit then
  local last = redis.call('INCRBY', seq_key, int(cost))
  local first = last - cost + 1
  -- ZADD in chunks: unpack() of a large cost would overflow Lua's C stack.
  local i = first
  while i <= last do
    local args = {}
    local j = math.min(last, i + 199)
    for m = i, j do
      args[#args + 1] = int(now)
      args[#args + 1] = int(m)
    end
    redis.call('ZADD', key, unpack(args))
    i = j + 1
  end
  count = count + cost
  allowed = 1
else
  -- The (count + cost - limit)-th oldest entry must leave before cost fits.
  local rank = count + cost - limit - 1
  local e = redis.call('ZRANGE', key, int(rank), int(rank), 'WITHSCORES')
  retry = math.max(0, tonumber(e[2]) + period - now)
end
local reset = 0
local newest = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
if newest[2] then
  reset = math.max(0, tonumber(newest[2]) + period - now)
end
if allowed == 1 and cost > 0 then
  expire(key, reset)
  expire(seq_key, reset)
end
return allowed, limit, math.max(0, limit - count), reset, retry, 0
