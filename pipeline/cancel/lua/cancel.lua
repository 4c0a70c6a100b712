#!lua name=pipeline_cancel
-- Cancellation and long work (pipeline/cancel/): the one transition that cancels work, the
-- registry of running long work with its heartbeats, and the reconciler's atomic re-check.
-- Every key shares the hash tag {P:cancel}, so each call stays in one Redis Cluster slot.
--
-- Keys (T = {P:cancel}):
--   T:sel     hash  "kind:lane:value" -> JSON {at, reason, until}: a standing cancellation.
--                   kind is event, key or tenant; lane is a lane name or "*" (every lane).
--                   An event selector covers that event whenever it comes up; a key or tenant
--                   selector covers the messages that existed at "at" (origin <= at).
--                   Entries past "until" (ms) cover nothing; the next transition prunes them.
--   T:ver     int   bumped by every transition: members reread T:sel when it changes
--   T:runs    hash  run id -> JSON {lane, member, event, key, tenant, origin, abandon}: long work
--                   running now (registered and removed by its member, cn_sync)
--   T:beats   zset  run id -> ms of its last heartbeat
--   T:stop    hash  run id -> reason: the run must stop (its member cancels it, then removes it)
--   T:counts  hash  "lane:cancelled", "lane:hung" -> how many
--
-- Functions:
--   cn_cancel  KEYS sel, ver, runs, stop
--              ARGV kind, lane, value, reason, now_ms, keep_ms -> {version, runs told to stop}
--              (now_ms 0: the Redis server's time, which Redis Streams stamps messages with)
--   cn_sync    KEYS runs, beats, stop, ver, counts
--              ARGV now_ms, n, (id, record)*n, n, (id)*n, n, (id, beat_ms)*n, n, (field, count)*n,
--                   id* -> {version, {id, reason}*}: register begun runs, remove ended ones,
--                   record heartbeats and counts, and say which of the listed runs must stop
--   cn_settle  KEYS sel, ver, runs, stop, beats
--              ARGV now_ms, timeout_ms, id -> alive | gone | stopping | dropped | <reason>:
--              the reconciler's re-check of one candidate, in one step with its transition

local function covers(kind, lane, value, at, rec)
  if lane ~= '*' and rec.lane ~= lane then return false end
  if kind == 'event' then return rec.event == value end
  if (tonumber(rec.origin) or 0) > at then return false end
  if kind == 'key' then return rec.key == value end
  if kind == 'tenant' then return rec.tenant == value end
  return false
end

-- The one transition to cancelled. kind "run" stops one running run (value is its id);
-- the other kinds record a standing selector and stop every registered run it covers.
local function transition(k, kind, lane, value, reason, now, keep_ms)
  local marked = 0
  if kind == 'run' then
    if redis.call('HEXISTS', k.runs, value) == 1 and redis.call('HSETNX', k.stop, value, reason) == 1 then
      marked = 1
    end
  else
    redis.call('HSET', k.sel, kind .. ':' .. lane .. ':' .. value,
      cjson.encode({at = now, reason = reason, ['until'] = now + keep_ms}))
    local runs = redis.call('HGETALL', k.runs)
    for i = 1, #runs, 2 do
      local rec = cjson.decode(runs[i + 1])
      if covers(kind, lane, value, now, rec) and redis.call('HSETNX', k.stop, runs[i], reason) == 1 then
        marked = marked + 1
      end
    end
    local sel = redis.call('HGETALL', k.sel)
    for i = 1, #sel, 2 do
      local entry = cjson.decode(sel[i + 1])
      if (tonumber(entry['until']) or 0) < now then redis.call('HDEL', k.sel, sel[i]) end
    end
  end
  return {redis.call('INCR', k.ver), marked}
end

-- The Redis server's clock in ms: the one Redis Streams stamps messages with (pl_produce).
local function server_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function cancel(keys, args)
  local k = {sel = keys[1], ver = keys[2], runs = keys[3], stop = keys[4]}
  local now = tonumber(args[5])
  if now == 0 then now = server_ms() end
  return transition(k, args[1], args[2], args[3], args[4], now, tonumber(args[6]))
end

local function sync(keys, args)
  local runs, beats, stop, ver, counts = keys[1], keys[2], keys[3], keys[4], keys[5]
  local now = tonumber(args[1])
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
      redis.call('ZADD', beats, 'GT', args[i + 1], args[i])
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
  local k = {sel = keys[1], ver = keys[2], runs = keys[3], stop = keys[4]}
  local beats = keys[5]
  local now, timeout, id = tonumber(args[1]), tonumber(args[2]), args[3]
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
redis.register_function('cn_sync', sync)
redis.register_function('cn_settle', settle)
