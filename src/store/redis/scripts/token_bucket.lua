-- token_bucket: scaled integer tokens + last refill tick (src/algorithm/token_bucket.rs).
-- Hash fields: t = tokens (scaled units), k = tick of the last refill,
-- u / d / r = the unit, tick (µs) and refill they are counted in.
local key = prefix .. ':tb'
local now_tick = math.floor(now / tick_us)
local rescaled = false
local st = redis.call('HMGET', key, 't', 'k', 'u', 'd', 'r')
local tokens, tick = capacity, now_tick
if st[1] then
  local last_tokens, last_tick = tonumber(st[1]), tonumber(st[2])
  local level = rescaled_level(st, last_tokens, last_tick, now, unit, tick_us, refill, 1)
  if level then
    last_tokens = math.min(math.floor(level * unit), capacity)
    last_tick = now_tick
    rescaled = true
  end
  tick = math.max(now_tick, last_tick)
  local elapsed = tick - last_tick
  if elapsed >= ceil_div(capacity - last_tokens, refill) then
    tokens = capacity
  else
    tokens = last_tokens + elapsed * refill
  end
end
local need = cost * unit
local allowed, retry = 0, 0
if tokens >= need then
  if not dry then
    tokens = tokens - need
  end
  allowed = 1
else
  retry = until_tick(tick + ceil_div(need - tokens, refill))
end
local reset = until_tick(tick + ceil_div(capacity - tokens, refill))
-- A converted level is kept even when denied: refill goes on at the new rate.
if (allowed == 1 and not dry) or rescaled then
  if same_scale(st, unit, tick_us, refill) then
    redis.call('HSET', key, 't', int(tokens), 'k', int(tick))
  else
    redis.call('HSET', key, 't', int(tokens), 'k', int(tick), 'u', int(unit), 'd', int(tick_us), 'r', int(refill))
  end
  expire(key, reset)
end
return allowed, limit, math.floor(tokens / unit), reset, retry, 0
