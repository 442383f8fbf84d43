-- A replica's heartbeat; returns the live count (`HEARTBEAT_SCRIPT`, redis/heartbeat.rs), and with
-- a second key, `{live count, the store's generation}` (`generation.lua`, which comes first),
-- and with a third, the reset log's news after ARGV[7], at most ARGV[8] entries, as well
-- (`reset_log.lua`, which comes first too).
if ARGV[5] == '1' then
  redis.call('ZREM', KEYS[1], ARGV[1])
else
  redis.call('ZADD', KEYS[1], ARGV[2], ARGV[1])
  redis.call('PEXPIRE', KEYS[1], ARGV[4])
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(' .. ARGV[3])
local live = redis.call('ZCARD', KEYS[1])
if KEYS[3] then
  return {live, generation(KEYS[2], ARGV[6]), reset_news(KEYS[3], ARGV[7], tonumber(ARGV[8]))}
end
if KEYS[2] then return {live, generation(KEYS[2], ARGV[6])} end
return live
