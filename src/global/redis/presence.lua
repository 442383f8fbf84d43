-- Publishes a replica's RLQS streams per counter and returns the other replicas' sums
-- (`PRESENCE_SCRIPT`, redis/presence.rs; its twin: `publish` in sync/memory.rs).
-- KEYS: one hash per item. ARGV: the replica's field, now (ms), when its fields expire (ms),
-- then per item its streams and their demand (milli-requests/s), both integers.
local me = ARGV[1]
local now = tonumber(ARGV[2])
local out = {}
for i = 1, #KEYS do
  local k = KEYS[i]
  local streams = ARGV[2 + 2 * i]
  if tonumber(streams) > 0 then
    redis.call('HSET', k, me, streams .. ' ' .. ARGV[3 + 2 * i] .. ' ' .. ARGV[3])
  else
    redis.call('HDEL', k, me)
  end
  local s, d, last = 0, 0, 0
  local all = redis.call('HGETALL', k)
  for j = 1, #all, 2 do
    local n, m, e = string.match(all[j + 1], '^(%d+) (%d+) (%d+)$')
    e = tonumber(e)
    -- Expired (or not a field this script wrote): no longer counts.
    if e == nil or e <= now then
      redis.call('HDEL', k, all[j])
    else
      if all[j] ~= me then
        s = s + tonumber(n)
        d = d + tonumber(m)
      end
      if e > last then last = e end
    end
  end
  -- The key lives as long as its longest-lived field (a hash left with none is gone).
  if last > now then redis.call('PEXPIRE', k, last - now) end
  out[2 * i - 1] = s
  out[2 * i] = d
end
return out
