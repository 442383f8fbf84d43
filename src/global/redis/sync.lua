-- States a replica's parts of window counters and returns their sums, each at least the
-- replica's floor less the refunds the key applied (`SYNC_SCRIPT`, redis/sync.rs; its twin:
-- `window` in sync/memory.rs, over `Held::state`, core/window/held.rs). A replica's part is
-- its field `me` (hits), `me-` (minus the refunds stated) and `me+` (those of them kept
-- out: they came when the count held less), so the sum of every field is the count.
local me = ARGV[1]
local back = me .. '-'
local kept = me .. '+'
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
  local sum, given, held = 0, 0, 0
  local kv = redis.call('HGETALL', k)
  for j = 1, #kv, 2 do
    local v = tonumber(kv[j + 1])
    sum = sum + v
    local last = string.sub(kv[j], -1)
    if last == '-' or last == '+' then given = given - v end
    if kv[j] == back then held = -v end
  end
  -- Refunds beyond those held are applied once, as far as the count holds hits (this call's
  -- included): what two replicas took off their own views of the same hits is not taken
  -- from the count twice. The rest is kept out for good, so a resent call applies nothing.
  if refunds > held then
    local new = refunds - held
    local applied = math.min(new, math.max(sum, 0))
    redis.call('HSET', k, back, -refunds)
    if applied < new then redis.call('HINCRBY', k, kept, new - applied) end
    sum = sum - applied
    given = given + applied
    wrote = true
  end
  if wrote and redis.call('PTTL', k) == -1 then redis.call('PEXPIRE', k, ARGV[base + 1]) end
  out[i] = math.max(sum, tonumber(ARGV[base + 6 + e]) - given)
end
return out
