-- A bucket whose limit changed (a global allocation moved): its hash holds the
-- level in the old scale (`u` unit, `d` tick µs, `r` refill per tick). Read in
-- the new one, the level and clock would credit tokens or time neither limit
-- allowed (a grow refilled the whole burst). Returns nil when the scale is
-- unchanged (or unrecorded), else the level in tokens at `now`, refilled
-- (`sign` 1: token bucket) or drained (-1: GCRA backlog) since `last_tick` at
-- the lower of the two rates. Concatenated in front of token_bucket.lua and
-- leaky_bucket.lua (before the prelude) and approximate_flush.lua.
local function rescaled_level(st, level, last_tick, now, unit, tick_us, refill, sign)
  local last_unit, last_tick_us, last_refill = tonumber(st[3]), tonumber(st[4]), tonumber(st[5])
  if not last_refill or (last_unit == unit and last_tick_us == tick_us and last_refill == refill) then
    return nil
  end
  local elapsed_us = math.max(0, now - last_tick * last_tick_us)
  local rate = math.min(last_refill / (last_unit * last_tick_us), refill / (unit * tick_us))
  return math.max(0, level / last_unit + sign * elapsed_us * rate)
end

-- Whether the hash already records this scale (`u`, `d`, `r`), so that a
-- write need only carry the level and tick: five fewer arguments for Redis
-- to parse on every allowed check. A hash that does not record all three (a
-- new key, or one written before scales were kept) gets the full write.
local function same_scale(st, unit, tick_us, refill)
  return tonumber(st[3]) == unit and tonumber(st[4]) == tick_us and tonumber(st[5]) == refill
end
