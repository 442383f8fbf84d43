-- Spends and reads the fleet's token buckets (`BUCKET_SCRIPT`, redis/sync.rs; its twin: the
-- `SyncOp::Bucket` arm of `MemoryStore::sync`, sync/memory.rs).
local me = ARGV[1]
local back = me .. '-'
local out = {}
local function new(stated, held)
  local d = (stated - held) % 4294967296
  if d >= 2147483648 then return 0 end
  return d
end
for i = 1, #KEYS do
  local k = KEYS[i]
  local b = 1 + (i - 1) * 10
  local delta = tonumber(ARGV[b + 1])
  local spend = tonumber(ARGV[b + 8])
  local stated = {tonumber(ARGV[b + 9]), tonumber(ARGV[b + 10])}
  local now = tonumber(ARGV[b + 2])
  local v = redis.call('HMGET', k, 't', 'n', me, back)
  local tat = tonumber(v[1])
  local spent = tonumber(v[2]) or 0
  local held = stated
  local added = delta
  if v[3] then
    local plus = new(stated[1], tonumber(v[3]))
    local minus = new(stated[2], tonumber(v[4]) or 0)
    added = plus - minus
    held = {(tonumber(v[3]) + plus) % 4294967296, ((tonumber(v[4]) or 0) + minus) % 4294967296}
    local run = spend + added - delta
    if spend >= 0 then spend = math.max(run, 0) else spend = math.min(run, 0) end
  end
  local write = false
  if tat == nil then
    tat = tonumber(ARGV[b + 6])
    write = tat > now
  end
  if added ~= 0 or spend ~= 0 then
    if spend ~= 0 then
      local limit = math.max(now + tonumber(ARGV[b + 5]), tat)
      local base = math.max(tat, tonumber(ARGV[b + 3]))
      tat = math.min(math.max(base + spend * tonumber(ARGV[b + 4]), now), limit)
    end
    spent = math.max(spent + added, 0)
    redis.call('HSET', k, me, held[1], back, held[2])
    write = true
  end
  if write then
    redis.call('HSET', k, 't', string.format('%.17g', tat), 'n', spent)
    redis.call('PEXPIRE', k, math.ceil(math.max(tat - now, 0) / 1000) + tonumber(ARGV[b + 7]))
  end
  out[2 * i - 1] = math.floor(tat)
  out[2 * i] = spent
end
return out
