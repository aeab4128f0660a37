-- sliding_window_counter: current + weighted previous window (src/algorithm/sliding_counter.rs).
local window = math.floor(now / period)
local start = window * period
local cur_key = prefix .. ':sc:' .. int(window)
local counts = redis.call('MGET', cur_key, prefix .. ':sc:' .. int(window - 1))
local cur = tonumber(counts[1] or '0')
local prev = tonumber(counts[2] or '0')
local ticks = period / tick_us
local elapsed = math.floor((now - start) / tick_us)
local count = cur + math.floor(prev * (ticks - elapsed) / ticks)
local allowed, retry = 0, 0
if count + cost <= limit then
  -- cost 0 is a check-only peek: nothing to write.
  if cost > 0 and not dry then
    cur = redis.call('INCRBY', cur_key, int(cost))
    -- Read as "previous" through the next window, so keep it until that ends.
    if cur == cost then
      expire(cur_key, start + 2 * period - now)
    end
  end
  allowed = 1
else
  -- Earliest tick at which cost fits if nothing else arrives: either this
  -- window once the previous one's weight has decayed, or the next window
  -- once this one's has.
  local wstart, weight, room = start, prev, limit - cur - cost
  if cur + cost > limit then
    wstart, weight, room = start + period, cur, limit - cost
  end
  local fitting = math.max(0, ticks - math.floor(((room + 1) * ticks - 1) / weight))
  retry = until_tick(wstart / tick_us + fitting)
end
local nxt = start + period
local reset = 0
if cur > 0 then
  reset = nxt + period - now
elseif prev > 0 then
  reset = nxt - now
end
local used = count
if allowed == 1 then
  used = count + cost
end
return allowed, limit, math.max(0, limit - used), reset, retry, 0
