
-- reserve: admits an estimate against every limit of a key and records the
-- reservation, in one call (src/store/reservation.rs). Appended after
-- multi.lua, whose check_all() decides and charges.
--
-- KEYS, ARGV[1 .. 1 + 9n]: as multi.lua (n limits); each limit's cost is
--               the estimate.
-- ARGV[2 + 9n]  nonce (32 hex digits)
-- ARGV[3 + 9n]  ttl µs           ARGV[4 + 9n] grace µs (the record outlives
--               the ttl by it, so a late or retried commit gets an answer)
-- ARGV[5 + 9n]  the most open reservations the key may hold
-- The record: hash `<KEYS[1]>:rv:<nonce>` with e (estimate), t (reserved at
-- µs), x (expires at µs), s (0 open, 1 committed, 2 released), a (actual,
-- -1 released), o (per limit: refunded,charged, …). The key's open ones:
-- sorted set `<KEYS[1]>:rvo`, member `<nonce>:<estimate>`, score its expiry.
-- Both share the key's hash tag, so they live in its Cluster slot.
-- Returns {status, expired, then six integers per limit as multi.lua}:
-- status 1 admitted and recorded, 0 denied (nothing charged), -1 too many
-- open (nothing decided; the third integer is how many), -2 nonce in use.
-- `expired`: open reservations found past their ttl and dropped from the
-- set (they stay charged at their estimate: nothing else to do).

local n = #KEYS
local nonce = ARGV[2 + 9 * n]
local ttl = tonumber(ARGV[3 + 9 * n])
local grace = tonumber(ARGV[4 + 9 * n])
local max_open = tonumber(ARGV[5 + 9 * n])
local record = KEYS[1] .. ':rv:' .. nonce
local open = KEYS[1] .. ':rvo'
local expired = redis.call('ZREMRANGEBYSCORE', open, '-inf', int(now))
local held = redis.call('ZCARD', open)
if held >= max_open then
  return {-1, expired, held}
end
if redis.call('EXISTS', record) == 1 then
  return {-2, expired}
end
local out, admitted = check_all()
local status = 0
if admitted then
  status = 1
  local estimate = tonumber(ARGV[10])
  local expires = now + ttl
  local keep = int(ceil_div(ttl + grace, 1000))
  redis.call('HSET', record, 'e', int(estimate), 't', int(now), 'x', int(expires), 's', '0')
  redis.call('PEXPIRE', record, keep)
  redis.call('ZADD', open, int(expires), nonce .. ':' .. int(estimate))
  if redis.call('PTTL', open) < tonumber(keep) then
    redis.call('PEXPIRE', open, keep)
  end
end
local reply = {status, expired}
for i = 1, #out do
  reply[i + 2] = out[i]
end
return reply
