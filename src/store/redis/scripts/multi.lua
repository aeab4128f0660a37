
-- multi: several limits on one descriptor (a rule's `limits:`), decided in
-- one call. Appended after prelude.lua and every algorithm's body, each as
-- its own decide_<index> (index = `Algorithm as usize`).
--
-- KEYS[j]   limit j's key prefix; all share the descriptor's hash tag
--           (`mr:{<rule>:<key>}`, then `:<j>` from the second limit on), so one
--           Cluster slot holds them all.
-- ARGV[1]   now in µs, or "" for the Redis server clock
-- ARGV[2 + 9 (j - 1) ...] for limit j: algorithm index, limit, period µs,
--           tick µs, unit, refill, capacity, ttl floor µs, cost
-- Returns six integers per limit, as the single scripts do. A first round
-- decides every limit without charging (`dry`); only when all allow does a
-- second round charge them, so a denial charges none. Both rounds see the
-- same state and the same `now`, so the second decides as the first did.
-- When a limit denies, the limits that would have admitted report what a
-- check-only peek would (nothing was taken from them).

local deciders = {decide_0, decide_1, decide_2, decide_3, decide_4}

-- Sets the prelude's limit globals to limit j's; returns its algorithm
-- index and its ninth argument (the cost; settle.lua: the overdraft).
local function load(j)
  local base = 1 + 9 * (j - 1)
  limit = tonumber(ARGV[base + 2])
  period = tonumber(ARGV[base + 3])
  tick_us = tonumber(ARGV[base + 4])
  unit = tonumber(ARGV[base + 5])
  refill = tonumber(ARGV[base + 6])
  capacity = tonumber(ARGV[base + 7])
  ttl_floor = tonumber(ARGV[base + 8])
  return tonumber(ARGV[base + 1]), tonumber(ARGV[base + 9])
end

local function run(j, peek)
  local algorithm, cost = load(j)
  if peek then
    cost = 0
  end
  return deciders[algorithm + 1](KEYS[j], cost)
end

local function put(out, j, allowed, lim, remaining, reset, retry, delay)
  local at = 6 * (j - 1)
  out[at + 1], out[at + 2], out[at + 3] = allowed, lim, remaining
  out[at + 4], out[at + 5], out[at + 6] = reset, retry, delay
end

local function round(out)
  local all = true
  for j = 1, #KEYS do
    local allowed, lim, remaining, reset, retry, delay = run(j, false)
    put(out, j, allowed, lim, remaining, reset, retry, delay)
    if allowed == 0 then
      all = false
    end
  end
  return all
end

-- Decides every limit; charges them all only when all admit. Returns the
-- six integers per limit and whether they were charged. The multi script's
-- body is `return (check_all())`; reserve.lua calls it too.
local function check_all()
  local out = {}
  dry = true
  if round(out) then
    dry = false
    round(out)
    return out, true
  end
  for j = 1, #KEYS do
    if out[6 * (j - 1) + 1] == 1 then
      put(out, j, run(j, true))
    end
  end
  return out, false
end
