-- States a replica's parts of window counters and returns their sums (`SYNC_SCRIPT`,
-- redis/sync.rs; its twin: `window` in sync/memory.rs).
local me = ARGV[1]
local back = me .. '-'
local out = {}
for i = 1, #KEYS do
  local k = KEYS[i]
  local base = 1 + math.floor((i - 1) / 2) * 5
  local e = (i - 1) % 2
  local hits = tonumber(ARGV[base + 2 + e])
  local refunds = tonumber(ARGV[base + 4 + e])
  local wrote = false
  if hits > 0 and tonumber(redis.call('HGET', k, me) or '0') < hits then
    redis.call('HSET', k, me, hits)
    wrote = true
  end
  if refunds > 0 and tonumber(redis.call('HGET', k, back) or '0') > -refunds then
    redis.call('HSET', k, back, -refunds)
    wrote = true
  end
  if wrote and redis.call('PTTL', k) == -1 then redis.call('PEXPIRE', k, ARGV[base + 1]) end
  local sum = 0
  for _, v in ipairs(redis.call('HVALS', k)) do sum = sum + tonumber(v) end
  out[i] = sum
end
return out
