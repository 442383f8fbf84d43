-- States a replica's parts of window counters and returns their sums, each at least the
-- replica's floor less the key's refunds (`SYNC_SCRIPT`, redis/sync.rs; its twin: `window` in
-- sync/memory.rs).
local me = ARGV[1]
local back = me .. '-'
local out = {}
for i = 1, #KEYS do
  local k = KEYS[i]
  local base = 1 + math.floor((i - 1) / 2) * 7
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
  local sum, given = 0, 0
  local kv = redis.call('HGETALL', k)
  for j = 1, #kv, 2 do
    local v = tonumber(kv[j + 1])
    sum = sum + v
    if string.sub(kv[j], -1) == '-' then given = given - v end
  end
  out[i] = math.max(sum, tonumber(ARGV[base + 6 + e]) - given)
end
return out
