#!lua name=pipeline_cancel
-- Cancellation and long work (pipeline/cancel/): the one transition that cancels work, the
-- registry of running long work with its heartbeats, and the reconciler's atomic re-check.
-- Every key shares the hash tag {P:cancel}, so each call stays in one Redis Cluster slot.
--
-- Keys (T = {P:cancel}):
--   T:sel     hash  "kind:lane:value" -> JSON {at, reason, until}: a standing cancellation.
--                   until is a number, or its decimal digits as a string once past 10^14 (a
--                   lane kept for ever: cjson writes a larger number with 14 digits only).
--                   kind is event, key or tenant; lane is a lane name or "*" (every lane).
--                   An event selector covers that event whenever it comes up; a key or tenant
--                   selector covers the messages that existed at "at" (origin <= at).
--                   Entries past "until" (ms) cover nothing; transitions prune them.
--   T:until   zset  T:sel field -> its until: pruning reads only the expired entries, at most
--                   PRUNED_PER_CALL per transition. Selectors written before this index existed
--                   (or by a release that does not keep it) are indexed INDEXED_PER_CALL a
--                   transition (HSCAN, cursor in T:meta "indexed", "done" once complete).
--   T:ver     int   bumped by every transition: members reread what changed when it moves
--   T:changes zset  T:sel field -> the version that last set or removed it (a removed field
--                   is absent from T:sel): a member holding version v reads the fields scored
--                   above v (cn_read). The CHANGES_KEPT latest are kept.
--   T:meta    hash  floor: the changes above it are all in T:changes (a member below it rereads
--                   everything); logged: the version of the latest transition logged here (a
--                   T:ver past it was bumped by a release without the log: reread everything);
--                   indexed: see T:until
--   T:runs    hash  run id -> JSON {lane, member, event, key, tenant, origin, abandon}: long work
--                   running now (registered and removed by its member, cn_sync)
--   T:beats   zset  run id -> ms of its last heartbeat, by the Redis server's clock: members
--                   send how long ago they beat (their monotonic clock), never a time of their
--                   host's, so members whose hosts' clocks disagree judge each other's runs
--                   alike (a release before this one wrote its member's own clock, same unit)
--   T:stop    hash  run id -> reason: the run must stop (its member cancels it, then removes it)
--   T:counts  hash  "lane:cancelled", "lane:hung" -> how many
--
-- Functions:
--   cn_cancel  KEYS sel, ver, runs, stop, until, changes, meta
--              ARGV kind, lane, value, reason, now_ms, keep_ms -> {version, runs told to stop}
--              (now_ms 0: the Redis server's time, which Redis Streams stamps messages with;
--              keep_ms as its decimal digits, up to 2^62, added to now_ms exactly: plus_ms)
--   cn_read    KEYS sel, ver, changes, meta
--              ARGV version -> {version, 0} when the caller must reread all of T:sel, else
--              {version, 1, (field, JSON or "" if removed)*}: what changed since ``version``
--   cn_sync    KEYS runs, beats, stop, ver, counts
--              ARGV now_ms, n, (id, record)*n, n, (id)*n, n, (id, age_ms)*n, n, (field, count)*n,
--                   id* -> {version, {id, reason}*}: register begun runs, remove ended ones,
--                   record heartbeats (each age_ms ago) and counts, and say which of the listed
--                   runs must stop (now_ms 0: the Redis server's time, what members send)
--   cn_settle  KEYS sel, ver, runs, stop, beats, meta
--              ARGV now_ms, timeout_ms, id -> alive | gone | stopping | dropped | <reason>:
--              the reconciler's re-check of one candidate, in one step with its transition
--              (now_ms 0: the Redis server's time, what members send)

local PRUNED_PER_CALL = 1000
local INDEXED_PER_CALL = 1000
local CHANGES_KEPT = 10000

local function covers(kind, lane, value, at, rec)
  if lane ~= '*' and rec.lane ~= lane then return false end
  if kind == 'event' then return rec.event == value end
  if (tonumber(rec.origin) or 0) > at then return false end
  if kind == 'key' then return rec.key == value end
  if kind == 'tenant' then return rec.tenant == value end
  return false
end

-- The next version, logged in T:meta. A T:ver that moved past the last logged version was
-- bumped by a release without the change log: the log is complete only from here on, and that
-- release may have written selectors without indexing them.
local function next_version(k)
  local before = tonumber(redis.call('GET', k.ver) or '0')
  if tonumber(redis.call('HGET', k.meta, 'logged')) ~= before then
    redis.call('HSET', k.meta, 'floor', before)
    redis.call('HDEL', k.meta, 'indexed')
  end
  local version = redis.call('INCR', k.ver)
  redis.call('HSET', k.meta, 'logged', version)
  return version
end

-- One bounded step of indexing the selectors T:until does not know yet.
local function index_step(k)
  local cursor = redis.call('HGET', k.meta, 'indexed')
  if cursor == 'done' then return end
  if not cursor then
    if redis.call('EXISTS', k.sel) == 0 then
      redis.call('HSET', k.meta, 'indexed', 'done')
      return
    end
    cursor = '0'
  end
  local scan = redis.call('HSCAN', k.sel, cursor, 'COUNT', INDEXED_PER_CALL)
  local items = scan[2]
  for i = 1, #items, 2 do
    local ok, entry = pcall(cjson.decode, items[i + 1])
    local until_ms = ok and type(entry) == 'table' and tonumber(entry['until']) or 0
    redis.call('ZADD', k['until'], until_ms, items[i])
  end
  redis.call('HSET', k.meta, 'indexed', scan[1] == '0' and 'done' or scan[1])
end

-- Remove at most PRUNED_PER_CALL selectors past their until, found by the index.
local function prune(k, now, version)
  local expired = redis.call('ZRANGEBYSCORE', k['until'], '-inf', '(' .. now, 'LIMIT', 0, PRUNED_PER_CALL)
  for _, field in ipairs(expired) do
    local raw = redis.call('HGET', k.sel, field)
    local ok, entry = pcall(cjson.decode, raw or '')
    local until_ms = ok and type(entry) == 'table' and tonumber(entry['until']) or 0
    if raw and until_ms >= now then
      redis.call('ZADD', k['until'], until_ms, field)  -- set again by a writer without the index
    else
      redis.call('HDEL', k.sel, field)
      redis.call('ZREM', k['until'], field)
      redis.call('ZADD', k.changes, version, field)
    end
  end
end

-- Keep the CHANGES_KEPT latest changes; members below the new floor reread everything.
local function trim_changes(k)
  local over = redis.call('ZCARD', k.changes) - CHANGES_KEPT
  if over <= 0 then return end
  local last = redis.call('ZRANGE', k.changes, over - 1, over - 1, 'WITHSCORES')
  redis.call('ZREMRANGEBYRANK', k.changes, 0, over - 1)
  if tonumber(last[2]) > tonumber(redis.call('HGET', k.meta, 'floor') or '0') then
    redis.call('HSET', k.meta, 'floor', last[2])
  end
end

-- now_ms + keep_ms as decimal digits, exact: keep_ms comes as sent (up to 2^62, past the 2^53
-- a Lua number holds exactly) and is added in two halves of 9 digits, each exact.
local BASE = 1000000000
local function plus_ms(now, keep)
  local low = tonumber(string.sub(keep, -9)) + now % BASE
  local high = (tonumber(string.sub(keep, 1, -10)) or 0) + math.floor(now / BASE)
  if low >= BASE then
    low, high = low - BASE, high + 1
  end
  if high == 0 then return string.format('%d', low) end
  return string.format('%d%09d', high, low)
end

-- The one transition to cancelled. kind "run" stops one running run (value is its id);
-- the other kinds record a standing selector and stop every registered run it covers.
local function transition(k, kind, lane, value, reason, now, keep_ms)
  local marked = 0
  local version = next_version(k)
  if kind == 'run' then
    if redis.call('HEXISTS', k.runs, value) == 1 and redis.call('HSETNX', k.stop, value, reason) == 1 then
      marked = 1
    end
  else
    index_step(k)
    local field = kind .. ':' .. lane .. ':' .. value
    local until_ms = plus_ms(now, keep_ms)
    -- A number, as every release wrote it, while cjson writes all its digits (below 10^14);
    -- past that its digits as a string, which every release reads too (int(str()), tonumber)
    local until_json = tonumber(until_ms) < 1e14 and tonumber(until_ms) or until_ms
    redis.call('HSET', k.sel, field, cjson.encode({at = now, reason = reason, ['until'] = until_json}))
    redis.call('ZADD', k['until'], until_ms, field)
    redis.call('ZADD', k.changes, version, field)
    local runs = redis.call('HGETALL', k.runs)
    for i = 1, #runs, 2 do
      local rec = cjson.decode(runs[i + 1])
      if covers(kind, lane, value, now, rec) and redis.call('HSETNX', k.stop, runs[i], reason) == 1 then
        marked = marked + 1
      end
    end
    prune(k, now, version)
    trim_changes(k)
  end
  return {version, marked}
end

-- The Redis server's clock in ms: the one Redis Streams stamps messages with (pl_produce).
local function server_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function cancel(keys, args)
  local k = {sel = keys[1], ver = keys[2], runs = keys[3], stop = keys[4], ['until'] = keys[5],
    changes = keys[6], meta = keys[7]}
  if not string.match(args[6], '^%d+$') or #args[6] > 19 then
    return redis.error_reply('keep_ms must be a count of milliseconds, got ' .. args[6])
  end
  local now = tonumber(args[5])
  if now == 0 then now = server_ms() end
  return transition(k, args[1], args[2], args[3], args[4], now, args[6])  -- keep_ms as sent
end

-- What changed in T:sel since the version a member holds, or {version, 0}: reread it all.
local function read(keys, args)
  local sel, ver, changes, meta = keys[1], keys[2], keys[3], keys[4]
  local since = tonumber(args[1])
  local version = tonumber(redis.call('GET', ver) or '0')
  if since == version then return {version, 1} end
  local floor = tonumber(redis.call('HGET', meta, 'floor'))
  local logged = tonumber(redis.call('HGET', meta, 'logged'))
  if floor == nil or logged ~= version or since < floor or since > version then
    return {version, 0}
  end
  local out = {version, 1}
  for _, field in ipairs(redis.call('ZRANGEBYSCORE', changes, '(' .. since, '+inf')) do
    out[#out + 1] = field
    out[#out + 1] = redis.call('HGET', sel, field) or ''
  end
  return out
end

local function sync(keys, args)
  local runs, beats, stop, ver, counts = keys[1], keys[2], keys[3], keys[4], keys[5]
  local now = tonumber(args[1])
  if now == 0 then now = server_ms() end
  local i = 2
  local n = tonumber(args[i]); i = i + 1
  for _ = 1, n do
    redis.call('HSET', runs, args[i], args[i + 1])
    redis.call('ZADD', beats, now, args[i])
    i = i + 2
  end
  n = tonumber(args[i]); i = i + 1
  for _ = 1, n do
    redis.call('HDEL', runs, args[i])
    redis.call('ZREM', beats, args[i])
    redis.call('HDEL', stop, args[i])
    i = i + 1
  end
  n = tonumber(args[i]); i = i + 1
  for _ = 1, n do
    if redis.call('HEXISTS', runs, args[i]) == 1 then
      redis.call('ZADD', beats, 'GT', now - tonumber(args[i + 1]), args[i])
    end
    i = i + 2
  end
  n = tonumber(args[i]); i = i + 1
  for _ = 1, n do
    redis.call('HINCRBY', counts, args[i], args[i + 1])
    i = i + 2
  end
  local stopping = {}
  for j = i, #args do
    local reason = redis.call('HGET', stop, args[j])
    if reason then
      stopping[#stopping + 1] = args[j]
      stopping[#stopping + 1] = reason
    end
  end
  return {tonumber(redis.call('GET', ver) or '0'), stopping}
end

local function selector_reason(sel, rec, now)
  local fields = {}
  for _, lane in ipairs({'*', rec.lane}) do
    if rec.event then fields[#fields + 1] = {'event', 'event:' .. lane .. ':' .. rec.event} end
    if rec.key then fields[#fields + 1] = {'key', 'key:' .. lane .. ':' .. rec.key} end
    if rec.tenant then fields[#fields + 1] = {'tenant', 'tenant:' .. lane .. ':' .. rec.tenant} end
  end
  for _, field in ipairs(fields) do
    local raw = redis.call('HGET', sel, field[2])
    if raw then
      local entry = cjson.decode(raw)
      local standing = (tonumber(entry['until']) or 0) >= now  -- else past its keep time
      if standing and (field[1] == 'event' or (tonumber(rec.origin) or 0) <= tonumber(entry.at)) then
        return entry.reason
      end
    end
  end
  return nil
end

local function settle(keys, args)
  local k = {sel = keys[1], ver = keys[2], runs = keys[3], stop = keys[4], meta = keys[6]}
  local beats = keys[5]
  local now, timeout, id = tonumber(args[1]), tonumber(args[2]), args[3]
  if now == 0 then now = server_ms() end
  local raw = redis.call('HGET', k.runs, id)
  if not raw then return 'gone' end
  local beat = tonumber(redis.call('ZSCORE', beats, id) or '0')
  if redis.call('HEXISTS', k.stop, id) == 1 then
    if beat <= now - 3 * timeout then  -- told to stop long ago and silent: its member is gone
      redis.call('HDEL', k.runs, id)
      redis.call('ZREM', beats, id)
      redis.call('HDEL', k.stop, id)
      return 'dropped'
    end
    return 'stopping'
  end
  local rec = cjson.decode(raw)
  local reason = nil
  local abandon = tonumber(rec.abandon) or 0
  if abandon > 0 and abandon <= now then
    reason = 'abandoned'
  else
    reason = selector_reason(k.sel, rec, now)
  end
  if not reason then
    if beat > now - timeout then return 'alive' end  -- a heartbeat landed: it wins
    reason = 'hung'
  end
  transition(k, 'run', rec.lane, id, reason, now, 0)
  return reason
end

redis.register_function('cn_cancel', cancel)
redis.register_function('cn_read', read)
redis.register_function('cn_sync', sync)
redis.register_function('cn_settle', settle)
