-- The token-bucket arithmetic of both bucket scripts, each of which is this prelude followed
-- by its own steps (bucket.lua: the sync's, redis/sync.rs; exact.lua: the exact rules',
-- exact/redis.rs); its Rust twin is core/gcra.rs. Also the one way a bucket's `tat` is kept
-- in Redis, by both: Unix µs with three decimals, 'W.NNN' (whole nanoseconds). A `tat` is
-- read as its two parts, each an exact integer; the steps work on `owed`, the ns from now to
-- the `tat` (below 0: full since then), exact while under 2^53 ns (104 days) either way,
-- where one double of Unix µs would round every spend to a quarter µs and drift.

-- The parts of a stored `tat` (whole µs, ns); nil when there is none. Also reads what the
-- sync script wrote before this encoding ('%.17g' of Unix µs: 'W' or 'W.D').
local function tat_parse(v)
  if not v then return nil end
  local w, f = string.match(v, '^(%d+)%.?(%d*)$')
  if not w then return nil end
  return tonumber(w), tonumber(string.sub(f .. '000', 1, 3))
end

-- The stored form of a `tat`'s parts.
local function tat_format(us, ns)
  return string.format('%.0f.%03d', us, ns)
end

-- The ns from `now` (Unix µs) to the `tat` `us`.`ns`.
local function tat_owed(us, ns, now)
  return (us - now) * 1000 + ns
end

-- The parts of the `tat` `owed` ns after `now` (Unix µs).
local function tat_at(owed, now)
  local us = math.floor(owed / 1000)
  return now + us, owed - us * 1000
end

-- Whether tokens worth `need` ns fit a bucket of `capacity` ns that owes `owed`: whole or
-- nothing, never past empty.
local function gcra_fits(owed, need, capacity)
  return owed + need <= capacity
end

-- `owed` after spending tokens worth `ns`, the first of them at `since` (ns from now, at most
-- 0): from the later of the two, never below now (full), at most `max_ahead` ahead of now or
-- where it was, if further.
local function gcra_spend(owed, since, ns, max_ahead)
  return math.min(math.max(math.max(owed, since) + ns, 0), math.max(max_ahead, owed))
end

-- `owed` after giving back tokens worth `ns` (`since` as for a spend): never past full.
local function gcra_give_back(owed, since, ns)
  return math.max(math.max(owed, since) - ns, 0)
end

-- `owed` after a run of `tokens` (below 0: given back) of `interval` ns each.
local function gcra_run(owed, since, tokens, interval, max_ahead)
  if tokens > 0 then return gcra_spend(owed, since, tokens * interval, max_ahead) end
  if tokens < 0 then return gcra_give_back(owed, since, -tokens * interval) end
  return owed
end
