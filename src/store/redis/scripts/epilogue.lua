
end

local out, filled = {}, 0
for i = 1, #KEYS do
  local allowed, lim, remaining, reset, retry, delay = decide(KEYS[i], tonumber(ARGV[8 + i]))
  out[filled + 1], out[filled + 2], out[filled + 3] = allowed, lim, remaining
  out[filled + 4], out[filled + 5], out[filled + 6] = reset, retry, delay
  filled = filled + 6
end
return out
