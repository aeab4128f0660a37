-- fixed_window: one counter per clock-aligned window (src/algorithm/fixed_window.rs).
local window = math.floor(now / period)
local key = prefix .. ':fw:' .. int(window)
local count = tonumber(redis.call('GET', key) or '0')
local reset = (window + 1) * period - now
local allowed, retry = 0, reset
if count + cost <= limit then
  -- cost 0 is a check-only peek: nothing to write.
  if cost > 0 then
    count = redis.call('INCRBY', key, int(cost))
    -- First hit of the window (also when the approximate path's INCRBY created it).
    if count == cost then
      expire(key, reset)
    end
  end
  allowed, retry = 1, 0
end
return {allowed, limit, math.max(0, limit - count), reset, retry, 0}
