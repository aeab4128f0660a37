-- Approximate path: applies one pod's local deltas for many keys in one call
-- (src/limiter/batcher/). Without the prelude on purpose (only
-- bucket_rescale.lua goes in front): it handles many keys and returns global
-- counts, not a decision.
--
-- KEYS[1]  the flush id's key, `<first delta's prefix>:f:<id>`: in the slot of
--          the deltas' keys, so the call stays in one slot on a Cluster.
-- KEYS[i+1] the key prefix `mr:{<rule>:<key>}` of delta i. On a Cluster the
--          caller groups deltas by slot, so every KEYS entry shares one slot.
-- ARGV[1]  how long the id is remembered, ms.
-- ARGV     then 9 values per delta, in KEYS order:
--          algorithm tag (fw | sc | tb), window index (fw, sc; 0 for tb),
--          hits to add, period µs, tick µs, unit, refill, capacity, ttl floor µs
-- Returns  {now µs (server TIME), then 2 integers per delta}:
--          fw: count of the window, 0
--          sc: count of the window, count of the window before
--          tb: tokens left (scaled units), tick of that level
--
-- The writes are the exact scripts' writes on the same keys (INCRBY on the
-- window counter, PEXPIRE on first write; the bucket hash for tb), so exact
-- and approximate pods share counters. A delta for a window whose keys have
-- already expired on the server clock is dropped: that window is over.
--
-- Idempotent: a call whose answer the client missed (a timeout) is sent again
-- with the same id. If the id is known, this call's deltas were applied
-- already: nothing is written and the answer is the current globals.
local repeated = not redis.call('SET', KEYS[1], '1', 'NX', 'PX', ARGV[1])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local out = {now}

local function int(n)
  return string.format('%d', n)
end

local function ceil_div(a, b)
  return math.floor((a + b - 1) / b)
end

-- Defined once, not per key: a closure per key costs an allocation each.
local function expire(key, keep_us, ttl_floor)
  redis.call('PEXPIRE', key, int(ceil_div(math.max(keep_us, ttl_floor), 1000)))
end

for i = 2, #KEYS do
  local prefix = KEYS[i]
  local a = (i - 2) * 9 + 1
  local tag = ARGV[a + 1]
  local window = tonumber(ARGV[a + 2])
  local hits = tonumber(ARGV[a + 3])
  if repeated then
    hits = 0
  end
  local period = tonumber(ARGV[a + 4])
  local tick_us = tonumber(ARGV[a + 5])
  local unit = tonumber(ARGV[a + 6])
  local refill = tonumber(ARGV[a + 7])
  local capacity = tonumber(ARGV[a + 8])
  local ttl_floor = tonumber(ARGV[a + 9])

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
      expire(key, (tick + ceil_div(capacity - tokens, refill)) * tick_us - now, ttl_floor)
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
        expire(key, keep, ttl_floor)
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
