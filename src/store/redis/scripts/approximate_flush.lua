-- Approximate path: applies one pod's local deltas for many keys in one call
-- (src/limiter/batcher.rs). Without the prelude on purpose (only
-- bucket_rescale.lua goes in front): it handles many keys and returns global
-- counts, not a decision.
--
-- KEYS[i]  the key prefix `mr:{<rule>:<key>}` of delta i. On a Cluster the
--          caller groups deltas by slot, so every KEYS entry shares one slot.
-- ARGV     9 values per key, in KEYS order:
--          algorithm tag (fw | sc | tb), window index (fw, sc; 0 for tb),
--          hits to add, period µs, tick µs, unit, refill, capacity, ttl floor µs
-- Returns  {now µs (server TIME), then 2 integers per key}:
--          fw: count of the window, 0
--          sc: count of the window, count of the window before
--          tb: tokens left (scaled units), tick of that level
--
-- The writes are the exact scripts' writes on the same keys (INCRBY on the
-- window counter, PEXPIRE on first write; the bucket hash for tb), so exact
-- and approximate pods share counters. A delta for a window whose keys have
-- already expired on the server clock is dropped: that window is over.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local out = {now}

local function int(n)
  return string.format('%d', n)
end

local function ceil_div(a, b)
  return math.floor((a + b - 1) / b)
end

for i, prefix in ipairs(KEYS) do
  local a = (i - 1) * 9
  local tag = ARGV[a + 1]
  local window = tonumber(ARGV[a + 2])
  local hits = tonumber(ARGV[a + 3])
  local period = tonumber(ARGV[a + 4])
  local tick_us = tonumber(ARGV[a + 5])
  local unit = tonumber(ARGV[a + 6])
  local refill = tonumber(ARGV[a + 7])
  local capacity = tonumber(ARGV[a + 8])
  local ttl_floor = tonumber(ARGV[a + 9])
  local function expire(key, keep_us)
    redis.call('PEXPIRE', key, int(ceil_div(math.max(keep_us, ttl_floor), 1000)))
  end

  if tag == 'tb' then
    -- Token bucket: refill as token_bucket.lua does, then take the batch's
    -- tokens (never below empty: a batch admitted on a stale view is overshoot).
    local key = prefix .. ':tb'
    local now_tick = math.floor(now / tick_us)
    local st = redis.call('HMGET', key, 't', 'k', 'u', 'd', 'r')
    local tokens, tick = capacity, now_tick
    if st[1] then
      local last_tokens, last_tick = tonumber(st[1]), tonumber(st[2])
      local level = rescaled_level(st, last_tokens, last_tick, now, unit, tick_us, refill, 1)
      if level then
        last_tokens = math.min(math.floor(level * unit), capacity)
        last_tick = now_tick
      end
      tick = math.max(now_tick, last_tick)
      local elapsed = tick - last_tick
      if elapsed >= ceil_div(capacity - last_tokens, refill) then
        tokens = capacity
      else
        tokens = last_tokens + elapsed * refill
      end
    end
    if hits > 0 then
      tokens = math.max(0, tokens - hits * unit)
      redis.call('HSET', key, 't', int(tokens), 'k', int(tick), 'u', int(unit), 'd', int(tick_us), 'r', int(refill))
      expire(key, (tick + ceil_div(capacity - tokens, refill)) * tick_us - now)
    end
    out[#out + 1] = tokens
    out[#out + 1] = tick
  else
    local key = prefix .. ':' .. tag .. ':' .. int(window)
    -- Same TTLs as fixed_window.lua / sliding_counter.lua.
    local keep = (window + 1) * period - now
    if tag == 'sc' then
      keep = keep + period
    end
    local count
    if hits > 0 and keep > 0 then
      count = redis.call('INCRBY', key, int(hits))
      if count == hits then
        expire(key, keep)
      end
    else
      count = tonumber(redis.call('GET', key) or '0')
    end
    local previous = 0
    if tag == 'sc' then
      previous = tonumber(redis.call('GET', prefix .. ':sc:' .. int(window - 1)) or '0')
    end
    out[#out + 1] = count
    out[#out + 1] = previous
  end
end
return out
