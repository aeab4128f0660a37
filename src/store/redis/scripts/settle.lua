
-- settle: commits or releases a reservation (src/store/reservation.rs) with
-- the arithmetic of src/algorithm/settle.rs, in one call. Appended after
-- multi.lua (for load() and run()).
--
-- KEYS, ARGV[1 .. 1 + 9n]: as multi.lua (n limits); each limit's ninth
--               argument is its max overdraft in hits, not a cost.
-- ARGV[2 + 9n]  nonce          ARGV[3 + 9n] actual, or -1 to release
-- An empty nonce charges ARGV[3 + 9n] hits with no record (Envoy's
-- stream-done settlement, src/limiter/stream_done.rs): each limit takes at
-- most its overdraft past itself, and the reply is {3, 0, amount, then per
-- limit 0, charged, remaining, limit}.
-- Returns {status, estimate, settled actual (-1: released), then per limit
-- refunded, charged, remaining, limit, then µs since the estimate was
-- charged and µs until the reservation's ttl ends (0: passed)}: status 1 settled now, 2 the same
-- settlement again (nothing changed; refunded and charged are the first
-- one's), -1 unknown id (nothing follows), -2 expired at its ttl (settled at
-- its estimate; nothing changed), -3 settled otherwise before (the third
-- integer says how; nothing changed).

-- A token bucket's level in signed scaled units at now (negative: debt, kept
-- as an empty bucket refilling from a later tick). The peek first refills
-- and converts a level counted under an older limit, and writes it.
local function bucket_level(prefix)
  deciders[4](prefix, 0)
  local st = redis.call('HMGET', prefix .. ':tb', 't', 'k')
  if not st[1] then
    return nil
  end
  local now_tick = math.floor(now / tick_us)
  return tonumber(st[1]) - math.max(0, tonumber(st[2]) - now_tick) * refill
end

local function set_bucket_level(prefix, level)
  local now_tick = math.floor(now / tick_us)
  local tokens, tick = level, now_tick
  if level < 0 then
    local ahead = ceil_div(-level, refill)
    tokens, tick = ahead * refill + level, now_tick + ahead
  end
  local key = prefix .. ':tb'
  redis.call('HSET', key, 't', int(tokens), 'k', int(tick), 'u', int(unit), 'd', int(tick_us), 'r', int(refill))
  expire(key, until_tick(tick + ceil_div(capacity - tokens, refill)))
end

-- A GCRA backlog drained to now, and the tick it is counted from.
local function backlog_at(prefix)
  deciders[5](prefix, 0)
  local st = redis.call('HMGET', prefix .. ':lb', 'b', 'k')
  if not st[1] then
    return nil
  end
  local last, last_tick = tonumber(st[1]), tonumber(st[2])
  local tick = math.max(math.floor(now / tick_us), last_tick)
  local elapsed = tick - last_tick
  if elapsed >= ceil_div(last, refill) then
    return 0, tick
  end
  return last - elapsed * refill, tick
end

local function set_backlog(prefix, backlog, tick)
  local key = prefix .. ':lb'
  redis.call('HSET', key, 'b', int(backlog), 'k', int(tick), 'u', int(unit), 'd', int(tick_us), 'r', int(refill))
  expire(key, until_tick(tick + ceil_div(backlog, refill)))
end

local function window_refund(key, amount)
  local back = math.min(amount, tonumber(redis.call('GET', key) or '0'))
  if back > 0 then
    redis.call('DECRBY', key, int(back))
  end
  return back
end

local function window_charge(key, amount, count, ceiling, keep_us)
  local c = math.min(amount, math.max(0, ceiling - count))
  if c > 0 and redis.call('INCRBY', key, int(c)) == c then
    expire(key, keep_us)
  end
  return c
end

-- Gives back up to `amount` hits charged at `charged_at`, where that charge
-- still counts.
local function refund(prefix, algorithm, charged_at, amount)
  local window = math.floor(now / period)
  local charged = math.floor(charged_at / period)
  if algorithm == 0 then
    if charged ~= window then
      return 0
    end
    return window_refund(prefix .. ':fw:' .. int(window), amount)
  elseif algorithm == 2 then
    if charged ~= window and charged + 1 ~= window then
      return 0
    end
    return window_refund(prefix .. ':sc:' .. int(charged), amount)
  elseif algorithm == 3 then
    local level = bucket_level(prefix)
    if not level then
      return 0
    end
    local after = math.min(level + amount * unit, capacity)
    set_bucket_level(prefix, after)
    return math.floor(math.max(0, after - level) / unit)
  elseif algorithm == 4 then
    local backlog, tick = backlog_at(prefix)
    if not backlog then
      return 0
    end
    local back = math.min(amount * unit, backlog)
    set_backlog(prefix, backlog - back, tick)
    return math.floor(back / unit)
  end
  return 0
end

-- Charges up to `amount` more hits now, at most `overdraft` past the limit.
local function charge(prefix, algorithm, amount, overdraft)
  local window = math.floor(now / period)
  local start = window * period
  if algorithm == 0 then
    local key = prefix .. ':fw:' .. int(window)
    local count = tonumber(redis.call('GET', key) or '0')
    return window_charge(key, amount, count, limit + overdraft, start + period - now)
  elseif algorithm == 2 then
    local key = prefix .. ':sc:' .. int(window)
    local counts = redis.call('MGET', key, prefix .. ':sc:' .. int(window - 1))
    local cur, prev = tonumber(counts[1] or '0'), tonumber(counts[2] or '0')
    local ticks = period / tick_us
    local elapsed = math.floor((now - start) / tick_us)
    local count = cur + math.floor(prev * (ticks - elapsed) / ticks)
    return window_charge(key, amount, count, limit + overdraft, start + 2 * period - now)
  elseif algorithm == 3 then
    local level = bucket_level(prefix) or capacity
    local room = math.floor(math.max(0, level + overdraft * unit) / unit)
    local c = math.min(amount, room)
    set_bucket_level(prefix, level - c * unit)
    return c
  elseif algorithm == 4 then
    local backlog, tick = backlog_at(prefix)
    if not backlog then
      backlog, tick = 0, math.floor(now / tick_us)
    end
    local c = math.min(amount, math.floor(math.max(0, capacity + overdraft * unit - backlog) / unit))
    set_backlog(prefix, backlog + c * unit, tick)
    return c
  end
  return 0
end

local n = #KEYS
local nonce = ARGV[2 + 9 * n]
local actual = tonumber(ARGV[3 + 9 * n])
if nonce == '' then
  local reply = {3, 0, actual}
  for j = 1, n do
    local algorithm, overdraft = load(j)
    local charged = charge(KEYS[j], algorithm, actual, overdraft)
    local _, lim, remaining = run(j, true)
    local at = #reply
    reply[at + 1], reply[at + 2], reply[at + 3], reply[at + 4] = 0, charged, remaining, lim
  end
  return reply
end
local record = KEYS[1] .. ':rv:' .. nonce
local rec = redis.call('HMGET', record, 'e', 't', 'x', 's', 'a', 'o')
if not rec[1] then
  return {-1}
end
local estimate, reserved_at, expires = tonumber(rec[1]), tonumber(rec[2]), tonumber(rec[3])
if rec[4] ~= '0' then
  local was = tonumber(rec[5])
  if was ~= actual then
    return {-3, estimate, was}
  end
  local first = {}
  for v in string.gmatch(rec[6] or '', '[^,]+') do
    first[#first + 1] = tonumber(v)
  end
  local reply = {2, estimate, was}
  for j = 1, n do
    local _, lim, remaining = run(j, true)
    local at = #reply
    reply[at + 1], reply[at + 2] = first[2 * j - 1] or 0, first[2 * j] or 0
    reply[at + 3], reply[at + 4] = remaining, lim
  end
  reply[#reply + 1] = math.max(0, now - reserved_at)
  reply[#reply + 1] = math.max(0, expires - now)
  return reply
end
if now >= expires then
  return {-2, estimate}
end
local settle_at = math.max(actual, 0)
local reply = {1, estimate, actual}
local first = {}
for j = 1, n do
  local algorithm, overdraft = load(j)
  local back, charged = 0, 0
  if settle_at <= estimate then
    back = refund(KEYS[j], algorithm, reserved_at, estimate - settle_at)
  else
    charged = charge(KEYS[j], algorithm, settle_at - estimate, overdraft)
  end
  local _, lim, remaining = run(j, true)
  local at = #reply
  reply[at + 1], reply[at + 2], reply[at + 3], reply[at + 4] = back, charged, remaining, lim
  first[2 * j - 1], first[2 * j] = int(back), int(charged)
end
local settled = '1'
if actual < 0 then
  settled = '2'
end
redis.call('HSET', record, 's', settled, 'a', int(actual), 'o', table.concat(first, ','))
redis.call('ZREM', KEYS[1] .. ':rvo', nonce .. ':' .. int(estimate))
reply[#reply + 1] = math.max(0, now - reserved_at)
reply[#reply + 1] = math.max(0, expires - now)
return reply
