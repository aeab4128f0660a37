-- outstanding: the estimates of a key's open reservations, summed
-- (src/store/reservation.rs; what the region holds but has not settled).
-- KEYS[1] the key prefix `mr:{<rule>:<key>}`. Read only; on the Redis clock.
-- The set holds at most MAX_OPEN_PER_KEY members.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local total = 0
for _, member in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1] .. ':rvo', '(' .. string.format('%d', now), '+inf')) do
  total = total + tonumber(string.match(member, ':(%d+)$'))
end
return {total}
