-- leaky_bucket (GCRA): TAT as tick + scaled backlog (src/algorithm/leaky_bucket.rs).
-- Hash fields: b = backlog (scaled units) still to drain after tick k,
-- u / d / r = the unit, tick (µs) and drain they are counted in.
local key = prefix .. ':lb'
local now_tick = math.floor(now / tick_us)
local rescaled = false
local st = redis.call('HMGET', key, 'b', 'k', 'u', 'd', 'r')
local backlog, tick = 0, now_tick
if st[1] then
  local last_backlog, last_tick = tonumber(st[1]), tonumber(st[2])
  local level = rescaled_level(st, last_backlog, last_tick, now, unit, tick_us, refill, -1)
  if level then
    last_backlog = math.ceil(level * unit)
    last_tick = now_tick
    rescaled = true
  end
  tick = math.max(now_tick, last_tick)
  local elapsed = tick - last_tick
  if elapsed >= ceil_div(last_backlog, refill) then
    backlog = 0
  else
    backlog = last_backlog - elapsed * refill
  end
end
local after = backlog + cost * unit
local allowed, retry, delay, level = 0, 0, 0, backlog
if after <= capacity then
  allowed = 1
  if not dry then
    level = after
  end
  delay = until_tick(tick + ceil_div(backlog, refill))
else
  retry = until_tick(tick + ceil_div(after - capacity, refill))
  delay = retry
end
local reset = until_tick(tick + ceil_div(level, refill))
-- A converted backlog is kept even when denied: drain goes on at the new rate.
if (allowed == 1 and not dry) or rescaled then
  if same_scale(st, unit, tick_us, refill) then
    redis.call('HSET', key, 'b', int(level), 'k', int(tick))
  else
    redis.call('HSET', key, 'b', int(level), 'k', int(tick), 'u', int(unit), 'd', int(tick_us), 'r', int(refill))
  end
  expire(key, reset)
end
-- A backlog from a larger old burst may exceed the new one: 0 left, not less.
return allowed, limit, math.floor(math.max(0, capacity - level) / unit), reset, retry, delay
