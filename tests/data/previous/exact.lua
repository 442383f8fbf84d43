-- Checks, and counts all or none of, a request's exact items (`EXACT_SCRIPT`, exact/redis.rs;
-- its twin: `exact::apply`, exact/mod.rs, with exact/bucket.rs).
local commit = ARGV[1] == '1'
local n = #KEYS / 2
local out = {0}
local fits = true
local curr = {}
for i = 1, n do
  local a = 1 + (i - 1) * 7
  local hits = tonumber(ARGV[a + 1])
  local over = 0
  if ARGV[a + 5] == '2' then
    local owed = 0
    local v = redis.call('GET', KEYS[2 * i - 1])
    if v then
      local w, f = string.match(v, '^(%d+)%.?(%d*)$')
      if w then
        owed = (tonumber(w) - tonumber(ARGV[a + 4])) * 1000 + tonumber(string.sub(f .. '000', 1, 3))
        if owed < 0 then owed = 0 end
      end
    end
    if ARGV[a + 7] ~= '1' then
      if tonumber(ARGV[a + 2]) == 0 or owed + hits * tonumber(ARGV[a + 3]) > tonumber(ARGV[a + 6]) then
        over = 1
        fits = false
      end
    end
    curr[i] = owed
    out[#out + 1] = owed
    out[#out + 1] = 0
    out[#out + 1] = over
  else
    local c = tonumber(redis.call('GET', KEYS[2 * i - 1]) or '0')
    local p = 0
    if ARGV[a + 5] == '1' then
      p = tonumber(redis.call('GET', KEYS[2 * i]) or '0')
    end
    if ARGV[a + 7] ~= '1' then
      local limit = tonumber(ARGV[a + 2])
      local count = c + hits
      if ARGV[a + 5] == '1' then
        count = count + math.floor(p * tonumber(ARGV[a + 4]) / tonumber(ARGV[a + 3]))
      end
      if limit == 0 or count > limit then
        over = 1
        fits = false
      end
    end
    curr[i] = c
    out[#out + 1] = p
    out[#out + 1] = c
    out[#out + 1] = over
  end
end
for i = 1, n do
  local a = 1 + (i - 1) * 7
  local hits = tonumber(ARGV[a + 1])
  if ARGV[a + 5] == '2' then
    local owed = curr[i]
    local after = owed
    if ARGV[a + 7] == '1' then
      after = math.max(owed - hits * tonumber(ARGV[a + 3]), 0)
    elseif commit and fits and hits > 0 then
      after = owed + hits * tonumber(ARGV[a + 3])
    end
    if after ~= owed then
      if after <= 0 then
        redis.call('DEL', KEYS[2 * i - 1])
      else
        local us = math.floor(after / 1000)
        local tat = string.format('%.0f.%03d', tonumber(ARGV[a + 4]) + us, after - us * 1000)
        redis.call('SET', KEYS[2 * i - 1], tat, 'PX', math.ceil(after / 1000000) + 1000)
      end
    end
  elseif ARGV[a + 7] == '1' then
    local back = math.min(hits, curr[i])
    if back > 0 then redis.call('DECRBY', KEYS[2 * i - 1], back) end
  elseif commit and fits and hits > 0 then
    local v = redis.call('INCRBY', KEYS[2 * i - 1], hits)
    if v == hits then redis.call('PEXPIRE', KEYS[2 * i - 1], ARGV[a + 6]) end
  end
end
if fits then out[1] = 1 end
return out
