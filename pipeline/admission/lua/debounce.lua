#!lua name=pipeline_debounce
-- The coalescing debouncer (pipeline/admission/debounce.py), loaded once per process with
-- FUNCTION LOAD REPLACE. Every key of a lane shares the hash tag {P:deb:LANE}, so each call stays
-- in one Redis Cluster slot (see pipeline/admission/debounce_keys.py for the trade-off):
--
--   {P:deb:LANE}:due     zset  conversation key -> when its next turn is due (ms, Redis clock);
--                              while a turn runs, its lease expiry instead. A key is in it
--                              exactly while its buffer holds messages.
--   {P:deb:LANE}:b:KEY   list  the key's buffered messages, oldest first; each element is
--                              "<arrival_ms>:<encoded message>". Never expires: it is emptied
--                              (and so deleted) only by db_finish after a turn succeeded.
--   {P:deb:LANE}:s:KEY   hash  mk   marker: id of the key's newest message
--                              last arrival of the newest message (ms)
--                              att  failed attempts of the messages at the head of the buffer
--                              tok  lease token of the running turn, lu its expiry (ms),
--                              n    how many messages (from the head) the running turn holds
--                              ra   after a failed turn: not due again before this (ms)
--                              Persists while the buffer holds messages; expires (ARGV
--                              idle_ttl_ms) once the key is idle.
--
-- Times come from Redis (TIME), so members with skewed clocks agree on what is due.
-- db_claim reaches the per-key list and hash of the keys it claims by name (built from ARGV
-- prefix): they carry the same hash tag as KEYS[1], so they live in its slot.

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function arrival_of(element)
  return tonumber(string.match(element, '^(%d+):'))
end

-- When the turn of an idle (not leased) key is due: `len` messages buffered, the first
-- arrived at `first`, the newest at `last`; `retry_at` is a failed turn's backoff, or nil.
local function due_at(now, len, first, last, retry_at, quiet, max_wait, max_batch)
  local due = now  -- a full buffer is due at once
  if len < max_batch then due = math.min(last + quiet, first + max_wait) end
  if retry_at and due < retry_at then due = retry_at end  -- a failed turn's backoff holds
  if due < now then due = now end
  return due
end

-- db_record: buffer one message and (re)schedule its key's turn.
-- KEYS[1] due zset   KEYS[2] buffer list   KEYS[3] state hash
-- ARGV[1] conversation key   ARGV[2] message id (the marker)   ARGV[3] encoded message
-- ARGV[4] quiet_ms   ARGV[5] max_wait_ms   ARGV[6] max_batch
-- Returns {due_ms, superseded, buffered, now_ms}: superseded is 1 when the key already had a
-- scheduled turn (it does not fire on its own: this message's turn replaces it). While a turn
-- of the key runs, due_ms is its lease expiry; db_finish schedules the rest.
local function record(keys, args)
  local now = now_ms()
  local state = redis.call('HMGET', keys[3], 'lu', 'ra')
  local buffered = redis.call('RPUSH', keys[2], now .. ':' .. args[3])
  redis.call('HSET', keys[3], 'mk', args[2], 'last', now)
  if buffered == 1 then redis.call('PERSIST', keys[3]) end  -- it expires only while idle
  local lease_until = tonumber(state[1])
  if lease_until and lease_until > now then
    return {lease_until, 0, buffered, now}
  end
  local first = now
  if buffered > 1 then first = arrival_of(redis.call('LINDEX', keys[2], 0)) end
  local due = due_at(now, buffered, first, now, tonumber(state[2]), tonumber(args[4]),
    tonumber(args[5]), tonumber(args[6]))
  local added = redis.call('ZADD', keys[1], due, args[1])
  return {due, 1 - added, buffered, now}
end

-- db_claim: lease up to ARGV[1] due keys and return their turns.
-- KEYS[1] due zset
-- ARGV[1] limit   ARGV[2] lease_ms   ARGV[3] max_batch   ARGV[4] token prefix (unique per call)
-- ARGV[5] key name prefix "{P:deb:LANE}:" (buffer = prefix .. "b:" .. key, state = .. "s:")
-- Returns {now_ms, next_due_ms or -1, stale, turn...}; each turn is
-- {key, token, attempt, due_ms, message...}. A key whose lease expired (its member died) is
-- claimed again with its attempt raised. stale counts due entries that had nothing to run.
local function claim(keys, args)
  local now = now_ms()
  local limit, lease, max_batch = tonumber(args[1]), tonumber(args[2]), tonumber(args[3])
  local result = {now, -1, 0}
  local due = redis.call('ZRANGE', keys[1], '-inf', now, 'BYSCORE', 'LIMIT', 0, limit, 'WITHSCORES')
  for i = 1, #due, 2 do
    local key, due_ms = due[i], tonumber(due[i + 1])
    local buf, st = args[5] .. 'b:' .. key, args[5] .. 's:' .. key
    local len = redis.call('LLEN', buf)
    if len == 0 then
      redis.call('ZREM', keys[1], key)
      result[3] = result[3] + 1
    else
      local state = redis.call('HMGET', st, 'tok', 'att')
      local attempt = tonumber(state[2]) or 0
      if state[1] then attempt = attempt + 1 end  -- the lease of the last holder ran out
      local n = math.min(len, max_batch)
      local token = args[4] .. ':' .. ((i + 1) / 2)
      redis.call('HSET', st, 'tok', token, 'lu', now + lease, 'n', n, 'att', attempt)
      redis.call('ZADD', keys[1], now + lease, key)
      local turn = {key, token, attempt + 1, due_ms}
      for _, element in ipairs(redis.call('LRANGE', buf, 0, n - 1)) do
        turn[#turn + 1] = element
      end
      result[#result + 1] = turn
    end
  end
  local first = redis.call('ZRANGE', keys[1], 0, 0, 'WITHSCORES')
  if first[2] then result[2] = tonumber(first[2]) end
  return result
end

-- db_finish: end a claimed turn.
-- KEYS[1] due zset   KEYS[2] buffer list   KEYS[3] state hash
-- ARGV[1] conversation key   ARGV[2] lease token   ARGV[3] "1" if the turn succeeded
-- ARGV[4] retry_in_ms (after a failure)   ARGV[5] quiet_ms   ARGV[6] max_wait_ms
-- ARGV[7] max_batch   ARGV[8] idle_ttl_ms
-- Succeeded: the turn's messages leave the buffer; messages that arrived meanwhile get a turn
-- due by the quiet period and max wait from their own arrival. Failed: every message stays,
-- the attempt count rises and the turn is due again after retry_in_ms.
-- Returns {outcome, due_ms or -1, buffered}: outcome is done (nothing left), scheduled, or
-- lost (the token no longer holds the lease: another member claimed the key; nothing changed).
local function finish(keys, args)
  local now = now_ms()
  local state = redis.call('HMGET', keys[3], 'tok', 'n')
  if state[1] ~= args[2] then
    return {'lost', -1, redis.call('LLEN', keys[2])}
  end
  local due
  if args[3] == '1' then
    redis.call('LTRIM', keys[2], tonumber(state[2]), -1)
    redis.call('HDEL', keys[3], 'tok', 'lu', 'n', 'ra', 'att')
  else
    redis.call('HDEL', keys[3], 'tok', 'lu', 'n')
    redis.call('HINCRBY', keys[3], 'att', 1)
    due = now + tonumber(args[4])
    redis.call('HSET', keys[3], 'ra', due)
  end
  local buffered = redis.call('LLEN', keys[2])
  if buffered == 0 then
    redis.call('ZREM', keys[1], args[1])
    redis.call('PEXPIRE', keys[3], tonumber(args[8]))
    return {'done', -1, 0}
  end
  if not due then  -- messages that arrived during the turn: due by their own arrival times
    local first = arrival_of(redis.call('LINDEX', keys[2], 0))
    local last = tonumber(redis.call('HGET', keys[3], 'last')) or first
    due = due_at(now, buffered, first, last, nil, tonumber(args[5]), tonumber(args[6]),
      tonumber(args[7]))
  end
  redis.call('ZADD', keys[1], due, args[1])
  return {'scheduled', due, buffered}
end

-- db_renew: extend the lease of a running turn.
-- KEYS[1] due zset   KEYS[2] state hash
-- ARGV[1] conversation key   ARGV[2] lease token   ARGV[3] lease_ms
-- Returns 1 if the token still held the lease (now extended), else 0.
local function renew(keys, args)
  if redis.call('HGET', keys[2], 'tok') ~= args[2] then return 0 end
  local lu = now_ms() + tonumber(args[3])
  redis.call('HSET', keys[2], 'lu', lu)
  redis.call('ZADD', keys[1], lu, args[1])
  return 1
end

-- db_next: when the lane's next turn is due.
-- KEYS[1] due zset
-- Returns {now_ms, next_due_ms or -1}.
local function next_due(keys, _args)
  local first = redis.call('ZRANGE', keys[1], 0, 0, 'WITHSCORES')
  return {now_ms(), tonumber(first[2]) or -1}
end

redis.register_function('db_record', record)
redis.register_function('db_claim', claim)
redis.register_function('db_finish', finish)
redis.register_function('db_renew', renew)
redis.register_function{function_name = 'db_next', callback = next_due, flags = {'no-writes'}}
