-- Checks, and counts all or none of, a request's exact items (`EXACT_SCRIPT`, exact/redis.rs;
-- its twin: `exact::apply`, exact/mod.rs, with exact/bucket.rs). Follows global/redis/gcra.lua.
local commit = ARGV[1] == '1'
local n = #KEYS / 2
local out = {0}
local fits = true
local curr = {}
local prev = {}
for i = 1, n do
  local a = 1 + (i - 1) * 7
  local hits = tonumber(ARGV[a + 1])
  local over = 0
  if ARGV[a + 5] == '2' then
    local owed = 0
    local us, ns = tat_parse(redis.call('GET', KEYS[2 * i - 1]))
    if us then owed = math.max(tat_owed(us, ns, tonumber(ARGV[a + 4])), 0) end
    if ARGV[a + 7] ~= '1' then
      local need = hits * tonumber(ARGV[a + 3])
      if tonumber(ARGV[a + 2]) == 0 or not gcra_fits(owed, need, tonumber(ARGV[a + 6])) then
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
    if ARGV[a + 5] == '1' or ARGV[a + 5] == '3' then
      p = tonumber(redis.call('GET', KEYS[2 * i]) or '0')
    end
    if ARGV[a + 7] ~= '1' then
      local limit = tonumber(ARGV[a + 2])
      local count = c + hits
      if ARGV[a + 5] == '1' then
        count = count + math.floor(p * tonumber(ARGV[a + 4]) / tonumber(ARGV[a + 3]))
      elseif ARGV[a + 5] == '3' then
        count = count + p
      end
      if limit == 0 or count > limit then
        over = 1
        fits = false
      end
    end
    curr[i] = c
    prev[i] = p
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
    local need = hits * tonumber(ARGV[a + 3])
    if ARGV[a + 7] == '1' then
      after = gcra_give_back(owed, 0, need)
    elseif commit and fits and hits > 0 then
      after = gcra_spend(owed, 0, need, tonumber(ARGV[a + 6]))
    end
    if after ~= owed then
      if after <= 0 then
        redis.call('DEL', KEYS[2 * i - 1])
      else
        local tat = tat_format(tat_at(after, tonumber(ARGV[a + 4])))
        redis.call('SET', KEYS[2 * i - 1], tat, 'PX', math.ceil(after / 1000000) + 1000)
      end
    end
  elseif ARGV[a + 7] == '1' then
    -- Each refund takes back at most what the call read; two of one counter in a call
    -- (a request naming a descriptor twice) stop at 0 together, as the twin's counter. A
    -- concurrency limit's release takes from the previous epoch first.
    local back_prev = 0
    if ARGV[a + 5] == '3' then back_prev = math.min(hits, prev[i]) end
    if back_prev > 0 then
      local left = redis.call('DECRBY', KEYS[2 * i], back_prev)
      if left < 0 then redis.call('INCRBY', KEYS[2 * i], -left) end
    end
    local back = math.min(hits - back_prev, curr[i])
    if back > 0 then
      local left = redis.call('DECRBY', KEYS[2 * i - 1], back)
      if left < 0 then redis.call('INCRBY', KEYS[2 * i - 1], -left) end
    end
  elseif commit and fits and hits > 0 then
    local v = redis.call('INCRBY', KEYS[2 * i - 1], hits)
    if v == hits then redis.call('PEXPIRE', KEYS[2 * i - 1], ARGV[a + 6]) end
  end
end
if fits then out[1] = 1 end
return out
