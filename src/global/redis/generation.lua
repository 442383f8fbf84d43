-- The store's generation (`GENERATION_SCRIPT` and `HEARTBEAT_SCRIPT`, redis/heartbeat.rs; its twin:
-- `MemoryStore::heartbeat`, sync/memory.rs): what `key` holds, or `new` written there, with no
-- expiry, when it holds nothing. A replica that remembers another value has found a store
-- that lost the sync's keys. A key of another type is left alone and answers false.
local function generation(key, new)
  local g = redis.pcall('GET', key)
  if g == false then
    redis.call('SET', key, new)
    return new
  end
  if type(g) ~= 'string' then return false end
  return g
end
