-- fixed_window: one counter per clock-aligned window (src/algorithm/fixed_window.rs).
-- INCRBY first and undo on a denial: an allowed check (the common case) is one
-- command instead of a GET and an INCRBY.
local window = math.floor(now / period)
local key = prefix .. ':fw:' .. int(window)
local reset = (window + 1) * period - now
if cost == 0 or dry then
  -- A check-only peek, or multi.lua's first round: nothing to write.
  local count = tonumber(redis.call('GET', key) or '0') + cost
  if count <= limit then
    return 1, limit, limit - count, reset, 0, 0
  end
  return 0, limit, math.max(0, limit - (count - cost)), reset, reset, 0
end
local count = redis.call('INCRBY', key, int(cost))
if count <= limit then
  -- First hit of the window (also when the approximate path's INCRBY created it).
  if count == cost then
    expire(key, reset)
  end
  return 1, limit, limit - count, reset, 0, 0
end
if count == cost then
  -- This INCRBY created the key (a cost above the limit): leave nothing behind
  -- without a TTL.
  redis.call('DEL', key)
else
  redis.call('DECRBY', key, int(cost))
end
return 0, limit, math.max(0, limit - (count - cost)), reset, reset, 0
