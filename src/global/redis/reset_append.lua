-- Appends to the reset log (`reset_log.lua`) an entry per entity, numbered on from its
-- newest, and trims it to its newest ARGV[1] entries (`RESET_LOG_APPEND`, redis/reset.rs;
-- its twin: `ResetLog::append`). KEYS[1]: the log; ARGV[2..]: the entities (32 hex digits
-- each). Returns the newest entry's number.
local head = reset_head(KEYS[1])
for i = 2, #ARGV do
  head = head + 1
  redis.call('LPUSH', KEYS[1], string.format('%d %s', head, ARGV[i]))
end
redis.call('LTRIM', KEYS[1], 0, tonumber(ARGV[1]) - 1)
return head
