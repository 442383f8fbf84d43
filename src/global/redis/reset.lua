-- Resets one entity's counters (`RESET_SCRIPT`, redis/reset.rs; its twin: `MemoryStore`'s
-- `reset_window` and `reset_bucket`, sync/memory.rs, and its `ExactStore::reset`,
-- exact/memory.rs). ARGV[i] says what KEYS[i] is:
--   w   a window counter of the sync (a hash of the replicas' parts): a field `reset-` takes
--       its sum to 0. Its name ends in '-', so sync.lua reads it as refunds the store
--       applied, lowering every replica's floor by as much; no replica id is `reset`.
--   b   a token bucket of the sync: its `t` set to 0 (full), when it exists.
--   x   an exact rule's counter (a string), and
--   xb  an exact rule's bucket: deleted, as Redis alone counts them.
-- Returns each key's count before (a bucket's: 0).
local out = {}
for i = 1, #KEYS do
  local k, kind = KEYS[i], ARGV[i]
  local before = 0
  if kind == 'w' then
    local kv = redis.call('HGETALL', k)
    for j = 2, #kv, 2 do before = before + tonumber(kv[j]) end
    if before > 0 then
      redis.call('HINCRBY', k, 'reset-', -before)
    else
      before = 0
    end
  elseif kind == 'b' then
    if redis.call('EXISTS', k) == 1 then redis.call('HSET', k, 't', '0') end
  elseif kind == 'x' then
    before = tonumber(redis.call('GET', k) or '0')
    redis.call('DEL', k)
  else
    redis.call('DEL', k)
  end
  out[i] = before
end
return out
