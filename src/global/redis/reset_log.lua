-- The fleet's reset log (`global/sync/reset_log.rs`; its twin: `ResetLog` there): a list,
-- newest entry first, of '<sequence number> <entity, 32 hex digits>', the sequence numbers
-- one apart, so the entry numbered s is at index head - s.
local function reset_head(key)
  local top = redis.call('LINDEX', key, 0)
  if not top then return 0 end
  return tonumber(string.match(top, '^(%d+)')) or 0
end

-- The entries after `after` ('': none, where the log is), oldest first, at most `most`:
-- {head, first, missed, entity...} (`span` in reset_log.rs), or false when the key holds
-- something else (the read is skipped; the heartbeat stands).
local function reset_news(key, after, most)
  local t = redis.call('TYPE', key)
  if type(t) == 'table' then t = t.ok end
  if t ~= 'list' and t ~= 'none' then return false end
  local head = reset_head(key)
  if after == '' then return {head, head + 1, 0} end
  after = tonumber(after)
  if after > head then after = 0 end
  local len = redis.call('LLEN', key)
  local oldest = head + 1 - math.min(len, head)
  local first = math.max(after + 1, oldest)
  local last = math.min(head, first + most - 1)
  local out = {head, first, first - (after + 1)}
  if first <= last then
    local items = redis.call('LRANGE', key, head - last, head - first)
    for i = #items, 1, -1 do
      out[#out + 1] = string.match(items[i], ' (%x+)$')
    end
  end
  return out
end
