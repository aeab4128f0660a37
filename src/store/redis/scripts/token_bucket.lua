-- token_bucket: scaled integer tokens + last refill tick (src/algorithm/token_bucket.rs).
-- Hash fields: t = tokens (scaled units), k = tick of the last refill.
local key = prefix .. ':tb'
local now_tick = math.floor(now / tick_us)
local st = redis.call('HMGET', key, 't', 'k')
local tokens, tick = capacity, now_tick
if st[1] then
  local last_tokens, last_tick = tonumber(st[1]), tonumber(st[2])
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
  tokens = tokens - need
  allowed = 1
else
  retry = until_tick(tick + ceil_div(need - tokens, refill))
end
local reset = until_tick(tick + ceil_div(capacity - tokens, refill))
if allowed == 1 then
  redis.call('HSET', key, 't', int(tokens), 'k', int(tick))
  expire(key, reset)
end
return allowed, limit, math.floor(tokens / unit), reset, retry, 0
