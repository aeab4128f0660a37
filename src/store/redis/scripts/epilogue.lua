
  end)()
  for j = 1, 6 do
    out[filled + j] = decision[j]
  end
  filled = filled + 6
end
return out
