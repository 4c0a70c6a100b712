#!lua name=pipeline_debounce
-- The coalescing debouncer (pipeline/admission/debounce/), loaded once per process with
-- FUNCTION LOAD REPLACE. Every key of a lane shares the hash tag {P:deb:LANE}, so each call stays
-- in one Redis Cluster slot (see pipeline/admission/debounce/keys.py for the trade-off):
--
--   {P:deb:LANE}:due     zset  conversation key -> when its next turn is due (ms, Redis clock);
--                              while a turn runs, its lease expiry instead. A key is in it
--                              exactly while its buffer holds messages.
--   {P:deb:LANE}:b:KEY   list  the key's buffered messages, oldest first; each element is
--                              "<arrival_ms>:<encoded message>". Never expires: it is emptied
--                              (and so deleted) only by db_finish after a turn succeeded.
--   {P:deb:LANE}:s:KEY   hash  mk   marker: id of the key's newest message
--                              rc   the key's last RECENT recorded messages, " id@timestamp "
--                                   each, newest first: a message found there is a redelivery
--                                   (or a retried call) and is not buffered again
--                              re   the event ids of the key's last RECENT recorded messages
--                                   that had one, " event@arrival@element " each, newest first
--                                   (event: a digest of the id, element: of the buffered
--                                   element): a copy of an event still in the buffer (a replay
--                                   at another offset) is not buffered again
--                              last arrival of the newest message (ms)
--                              att  failed attempts of the messages at the head of the buffer
--                              ff   when the first failed finish of those messages ended their
--                                   run (ms; kept by later failures, cleared with att)
--                              tok  lease token of the running turn, lu its expiry (ms),
--                              n    how many messages (from the head) the running turn holds
--                              ra   after a failed turn: not due again before this (ms)
--                              xt   the lease tokens whose lease lapsed and whose turn another
--                                   claim took over, " token " each, newest first (the last
--                                   DISPLACED): db_renew answers -1 to them alone. Kept by
--                                   finish (a token displaced stays displaced).
--                              Persists while the buffer holds messages; expires (ARGV
--                              idle_ttl_ms) once the key is idle.
--   {P:deb:LANE}:e:EVENT string where the buffered message whose event id has the digest EVENT
--                              waits: "<arrival>@<element>@<conversation key>" (as in its `re`
--                              entry; an earlier release wrote the conversation key alone), for
--                              the ingress's sweeper to ask whether a webhook's event still waits
--                              (db_held) and for db_record to drop a copy of it, however many
--                              messages the conversation recorded since. Written by db_record,
--                              deleted by the finish that takes the message out of the buffer
--                              (found through l:KEY, or `re`) or once db_held finds it gone. It
--                              lives as long as its message waits, however long that is (a
--                              night without members or ingress, a turn failing for hours): its
--                              expiry, ARGV held_ttl_ms after it was written (a week past the
--                              window by default), only bounds one no finish deleted (a finish
--                              of an earlier release deletes only the locators `re` lists).
--   {P:deb:LANE}:l:KEY   list  the locators written for the conversation's buffered messages, in
--                              buffer order: "<event>@<arrival>@<element>" each (as in `re`), so
--                              that a finish deletes the locator of every event that left the
--                              buffer, not only of the last RECENT. A finish pops the entries of
--                              the messages that left; deleted with the buffer; expires ARGV
--                              held_ttl_ms after the last record that pushed to it.
--   {P:deb:LANE}:armed   string "<due_ms>:<holder>": the due time (ms) some runner holds a
--                              timer for (holder '' when a wake-up was pushed for it): the
--                              lane's earliest due time as last announced. Expires `grace` ms
--                              after it, so a timer whose runner died is forgotten (and taken
--                              over by a runner that db_step told of it).
--   {P:deb:LANE}:wake    list  wake-ups for runners blocked on BLPOP: each element is a due
--                              time (ms) earlier than any timer a runner held. Bounded (LTRIM).
--   {P:deb:LANE}:step:R  list  the last db_step of runner R that finished or leased turns:
--                              its token, then its reply flattened. A call sent again with that
--                              token (its reply lost, e.g. a reset connection: the client's retry
--                              policy sends it again) gets the same reply, so nothing is finished
--                              twice and its turns are not left leased to no one, to be claimed
--                              again with their attempt raised. Expires lease_ms after the call.
--
-- Runners never poll: the runner whose db_step leased turns takes the timer for the lane's next
-- due time (the step stores it in `armed`); a db_record that makes a turn due earlier than the
-- armed time (or finds no live armed time) pushes that due time onto `wake`, which wakes one
-- blocked runner. A db_step told that another runner holds the timer returns when `armed`
-- expires: its runner steps again then, and takes the timer if that runner died. An idle lane
-- has no armed time, no timers and makes no calls.
--
-- Times come from Redis (TIME), so members with skewed clocks agree on what is due.
-- db_claim and db_step reach the per-key list and hash of the keys they claim or finish by name
-- (built from ARGV prefix): they carry the same hash tag as KEYS[1], so they live in its slot.
-- Both also declare {P:deb:LANE}:slot_guard, a key never written: while the slot migrates, Redis
-- Cluster refuses (TRYAGAIN) a call declaring a key it does not have, before it runs, instead of
-- stopping it part way at the first conversation already moved (its earlier leases kept).

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local WAKE_KEEP = 63  -- wake-ups kept in the list beyond the newest (a few runners read it)


-- The armed due time and the runner holding its timer ('' when a wake-up was pushed for it).
local function armed_of(armed_key)
  local value = redis.call('GET', armed_key)
  if not value then return nil, nil end
  local due, owner = string.match(value, '^(%d+):(.*)$')
  return tonumber(due), owner
end

-- Arm `due` for `owner` (or, with `push`, for whichever runner the wake-up reaches) if it is
-- earlier than the armed time or none is armed. Returns 1 if it armed.
local function arm(armed_key, wake_key, due, now, grace, push, owner)
  local armed = armed_of(armed_key)
  if armed and armed <= due then return 0 end
  redis.call('SET', armed_key, due .. ':' .. owner, 'PX', math.max(due - now, 0) + grace)
  if push then
    redis.call('LPUSH', wake_key, due)
    redis.call('LTRIM', wake_key, 0, WAKE_KEEP)
  end
  return 1
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

-- How many recorded messages a key remembers to tell a redelivery from a new message: a
-- member killed before its commit has the next owner read again what it recorded since (one
-- commit interval's worth, 500 ms by default); past this many, a redelivery is buffered again.
local RECENT = 64

-- How many displaced lease tokens a conversation remembers (its `xt`): a holder stalled past
-- its lease is told its turn was taken at its next renewal unless more takeovers came between.
local DISPLACED = 8

-- `recent` (" a b ... ") with `token` (" x ") put first, the oldest dropped past `keep`
-- (RECENT when not given).
local function remember(recent, token, keep)
  keep = keep or RECENT
  local kept = {}
  for element in string.gmatch(recent, '%S+') do
    if #kept + 1 >= keep then break end
    kept[#kept + 1] = element
  end
  if #kept == 0 then return token end
  return token .. table.concat(kept, ' ') .. ' '
end

-- Whether the buffer `buf` still holds the element whose digest is `element`, arrived at
-- `arrival` (ms): it is looked for among the elements of that arrival, found by a binary search
-- (arrivals only grow along the buffer) and read a few at a time. The work does not grow with
-- the buffer: reading it whole, for each event the sweeper asked about, held Redis for seconds
-- once a conversation buffered 100,000 messages behind a failing turn.
local function holds_element(buf, arrival, element)
  local at = tonumber(arrival)
  local low, high = 0, redis.call('LLEN', buf)  -- the first element of that arrival, or high
  while low < high do
    local middle = math.floor((low + high) / 2)
    if arrival_of(redis.call('LINDEX', buf, middle)) < at then
      low = middle + 1
    else
      high = middle
    end
  end
  while true do
    local chunk = redis.call('LRANGE', buf, low, low + 15)
    for _, buffered in ipairs(chunk) do
      if arrival_of(buffered) ~= at then return false end
      if string.sub(redis.sha1hex(buffered), 1, 16) == element then return true end
    end
    if #chunk < 16 then return false end
    low = low + 16
  end
end

-- The value of {P:deb:LANE}:e:EVENT: where the event's message is buffered.
local function locator(arrival, element, key)
  return arrival .. '@' .. element .. '@' .. key
end

-- The arrival, element digest and conversation key of an e:EVENT value; an earlier release
-- wrote the conversation key alone (then arrival and element are nil).
local function located(value)
  local arrival, element, key = string.match(value, '^(%d+)@(%x+)@(.*)$')
  if arrival then return arrival, element, key end
  return nil, nil, value
end

-- Where conversation `key` (buffer `buf`, `re` field `events`) still buffers `event`, found by
-- its newest `re` entry or by `index` (the value of its e:EVENT key, or nil): its arrival and
-- element digest, or nil when it is buffered no more.
local function buffered_at(buf, events, event, index, key)
  local arrival, element = string.match(events or ' ', ' ' .. event .. '@(%d+)@(%x+) ')
  if arrival and holds_element(buf, arrival, element) then return arrival, element end
  if not index then return nil end
  local at, digest, of = located(index)
  if at and of == key and (at ~= arrival or digest ~= element)
      and holds_element(buf, at, digest) then
    return at, digest
  end
  return nil
end

-- db_record: buffer one message and (re)schedule its key's turn.
-- KEYS[1] due zset   KEYS[2] buffer list   KEYS[3] state hash   KEYS[4] armed   KEYS[5] wake
-- KEYS[6] {P:deb:LANE}:e:EVENT and KEYS[7] {P:deb:LANE}:l:KEY, given with an event id
-- ARGV[1] conversation key   ARGV[2] message id (the marker)   ARGV[3] encoded message
-- ARGV[4] quiet_ms   ARGV[5] max_wait_ms   ARGV[6] max_batch   ARGV[7] grace_ms
-- ARGV[8] the message's timestamp (ms)   ARGV[9] a digest of its event id ('' when none)
-- Returns {due_ms, superseded, buffered, now_ms, woke}: superseded is 1 when the key already
-- had a scheduled turn (it does not fire on its own: this message's turn replaces it). While a
-- turn of the key runs, due_ms is its lease expiry; db_finish schedules the rest. woke is 1
-- when the turn is due before any armed timer: a wake-up was pushed for it. due_ms is -1 when
-- the message (its id "topic:partition:offset" and timestamp) is among the key's RECENT last
-- recorded ones (a redelivery after a crash before the commit, or a retried call that had
-- run), or when a message with its event id (ARGV[9]) is still in the buffer, found by its `re`
-- entry or by KEYS[6] (a copy the ingress's sweeper replayed while the first waited or ran):
-- nothing changed, but for the copy's id remembered. KEYS[6] ({P:deb:LANE}:e:EVENT, given with
-- an event id) is set to where the buffered message waits for ARGV[10] ms (held_ttl_ms: the
-- finish that takes the message out deletes it sooner), the copy's drop included, and an entry
-- for it pushed onto KEYS[7] ({P:deb:LANE}:l:KEY, given with KEYS[6]), kept as long.
local function record(keys, args)
  local now = now_ms()
  local token = ' ' .. args[2] .. '@' .. (args[8] or '') .. ' '
  local recent, events = unpack(redis.call('HMGET', keys[3], 'rc', 're'))
  recent, events = recent or ' ', events or ' '
  if string.find(recent, token, 1, true) then
    return {-1, 0, redis.call('LLEN', keys[2]), now, 0}
  end
  local event = args[9] or ''
  if event ~= '' then
    local index = keys[6] and redis.call('GET', keys[6]) or nil
    local arrival, element = buffered_at(keys[2], events, event, index, args[1])
    if arrival then
      redis.call('HSET', keys[3], 'rc', remember(recent, token))
      if keys[6] then
        local ttl = args[10]  -- as sent: a number past 2^53 would reach Redis as a float
        redis.call('SET', keys[6], locator(arrival, element, args[1]), 'PX', ttl)
        -- the first copy's own entry may be missing (recorded by an earlier release), so one
        -- more: an entry behind later ones is popped with them, never before its message left
        if keys[7] then
          redis.call('RPUSH', keys[7], event .. '@' .. arrival .. '@' .. element)
          redis.call('PEXPIRE', keys[7], ttl)
        end
      end
      return {-1, 0, redis.call('LLEN', keys[2]), now, 0}
    end
  end
  local state = redis.call('HMGET', keys[3], 'lu', 'ra')
  local element = now .. ':' .. args[3]
  local buffered = redis.call('RPUSH', keys[2], element)
  redis.call('HSET', keys[3], 'mk', args[2], 'last', now, 'rc', remember(recent, token))
  if event ~= '' then
    local digest = string.sub(redis.sha1hex(element), 1, 16)
    local entry = ' ' .. event .. '@' .. now .. '@' .. digest .. ' '
    redis.call('HSET', keys[3], 're', remember(events, entry))
    if keys[6] then
      local ttl = args[10]  -- as sent (above)
      redis.call('SET', keys[6], locator(now, digest, args[1]), 'PX', ttl)
      if keys[7] then
        redis.call('RPUSH', keys[7], event .. '@' .. now .. '@' .. digest)
        redis.call('PEXPIRE', keys[7], ttl)
      end
    end
  end
  if buffered == 1 then redis.call('PERSIST', keys[3]) end  -- it expires only while idle
  local lease_until = tonumber(state[1])
  if lease_until and lease_until > now then
    return {lease_until, 0, buffered, now, 0}
  end
  local first = now
  if buffered > 1 then first = arrival_of(redis.call('LINDEX', keys[2], 0)) end
  local due = due_at(now, buffered, first, now, tonumber(state[2]), tonumber(args[4]),
    tonumber(args[5]), tonumber(args[6]))
  local added = redis.call('ZADD', keys[1], due, args[1])
  local woke = arm(keys[4], keys[5], due, now, tonumber(args[7]), true, '')
  return {due, 1 - added, buffered, now, woke}
end

-- Lease up to `limit` due keys of the zset `due_key`; returns the turns and the stale count.
-- Each turn is {key, token, attempt, due_ms, first_failure_ms or -1, message...}. A key whose
-- lease expired (its member died, or stalled past it) is claimed again with its attempt raised,
-- and the token it displaced is added to `xt` (its holder's next renewal is told the turn was
-- taken). stale counts due entries with nothing to run.
local function claim_due(due_key, limit, lease, max_batch, token_prefix, prefix, now)
  local turns, stale = {}, 0
  local due = redis.call('ZRANGE', due_key, '-inf', now, 'BYSCORE', 'LIMIT', 0, limit, 'WITHSCORES')
  for i = 1, #due, 2 do
    local key, due_ms = due[i], tonumber(due[i + 1])
    local buf, st = prefix .. 'b:' .. key, prefix .. 's:' .. key
    local len = redis.call('LLEN', buf)
    if len == 0 then
      redis.call('ZREM', due_key, key)
      stale = stale + 1
    else
      local state = redis.call('HMGET', st, 'tok', 'att', 'ff', 'xt')
      local attempt = tonumber(state[2]) or 0
      local failed = -1  -- ff counts only while att does (the turn has not succeeded since)
      if attempt > 0 and state[3] then failed = tonumber(state[3]) end
      if state[1] then  -- the lease of the last holder ran out: its turn is taken over
        attempt = attempt + 1
        redis.call('HSET', st, 'xt', remember(state[4] or ' ', ' ' .. state[1] .. ' ', DISPLACED))
      end
      local n = math.min(len, max_batch)
      local token = token_prefix .. ':' .. ((i + 1) / 2)
      redis.call('HSET', st, 'tok', token, 'lu', now + lease, 'n', n, 'att', attempt)
      redis.call('ZADD', due_key, now + lease, key)
      local turn = {key, token, attempt + 1, due_ms, failed}
      for _, element in ipairs(redis.call('LRANGE', buf, 0, n - 1)) do
        turn[#turn + 1] = element
      end
      turns[#turns + 1] = turn
    end
  end
  return turns, stale
end

-- The lane's earliest due time (leases included), or nil.
local function earliest(due_key)
  local first = redis.call('ZRANGE', due_key, 0, 0, 'WITHSCORES')
  return tonumber(first[2])
end

-- The caller (`owner`) takes the timer for the lane's earliest due time (or there is none).
local function take_timer(due_key, armed_key, now, grace, owner)
  local next_due = earliest(due_key)
  if next_due then
    redis.call('SET', armed_key, next_due .. ':' .. owner, 'PX', math.max(next_due - now, 0) + grace)
    return next_due
  end
  redis.call('DEL', armed_key)
  return -1
end

-- After a turn succeeded (the buffer `buf` lost its head): a test of whether the element whose
-- digest is `element`, arrived at `arrival`, is still in `buf`: it is if it arrived after the
-- new head, or at the head's arrival and among the buffered elements of that arrival.
local function still_buffered(buf)
  local head = redis.call('LINDEX', buf, 0)
  local first = head and arrival_of(head)
  local at_first = nil  -- digests of the buffered elements that arrived at `first`
  return function(arrival, element)
    if not first then return false end
    arrival = tonumber(arrival)
    if arrival ~= first then return arrival > first end
    if not at_first then
      at_first = {}
      local from = 0
      repeat
        local chunk = redis.call('LRANGE', buf, from, from + 63)
        for _, buffered in ipairs(chunk) do
          if arrival_of(buffered) ~= first then chunk = {} break end
          at_first[string.sub(redis.sha1hex(buffered), 1, 16)] = true
        end
        from = from + 64
      until #chunk < 64
    end
    return at_first[element] == true
  end
end

-- Delete the locator of `event` if it still says its message waits at `arrival`/`element` of
-- conversation `key` (or names the conversation alone, as an earlier release wrote it): a copy
-- of the event buffered since has a locator of its own, which stays.
local function drop_locator(prefix, event, arrival, element, key)
  local name = prefix .. 'e:' .. event
  local value = redis.call('GET', name)
  if value and (value == locator(arrival, element, key) or value == key) then
    redis.call('DEL', name)
  end
end

-- After a turn succeeded: drop from the `re` field of state `st` of conversation `key` the
-- events whose messages left the buffer (`still`: still_buffered), and their locators.
local function forget_events(st, prefix, key, still)
  local events = redis.call('HGET', st, 're')
  if not events then return end
  local kept = {}
  for entry in string.gmatch(events, '%S+') do
    local event, arrival, element = string.match(entry, '^(%x+)@(%d+)@(%x+)$')
    if event and still(arrival, element) then
      kept[#kept + 1] = entry
    elseif event then
      drop_locator(prefix, event, arrival, element, key)
    end
  end
  if #kept == 0 then
    redis.call('HDEL', st, 're')
  else
    redis.call('HSET', st, 're', ' ' .. table.concat(kept, ' ') .. ' ')
  end
end

-- After a turn succeeded: delete the locators of every event whose message left the buffer
-- (`still`: still_buffered), popped from the head of the conversation's list `list` of them
-- (buffer order) up to the first whose message is still buffered. Entries an earlier release's
-- finish left (it trims the buffer, not the list) go with them.
local function forget_located(list, prefix, key, still)
  while true do
    local entries = redis.call('LRANGE', list, 0, 63)
    local gone = 0
    for _, entry in ipairs(entries) do
      local event, arrival, element = string.match(entry, '^(%x+)@(%d+)@(%x+)$')
      if event and still(arrival, element) then break end
      if event then drop_locator(prefix, event, arrival, element, key) end
      gone = gone + 1
    end
    if gone > 0 then redis.call('LTRIM', list, gone, -1) end
    if gone < 64 then return end
  end
end

-- End one claimed turn of `key` (buffer `buf`, state `st`); returns {outcome, due_ms, buffered}.
-- Succeeded (ok == '1'): the turn's messages leave the buffer; messages that arrived meanwhile
-- get a turn due by the quiet period and max wait from their own arrival. Failed: every message
-- stays, the attempt count rises (the first failure's time is kept) and the turn is due again
-- after retry_ms. outcome is done (nothing left), scheduled, or lost (the token no longer holds
-- the lease: another member claimed the key; nothing changed).
local function finish_one(due_key, buf, st, key, token, ok, retry_ms, quiet, max_wait,
                          max_batch, idle_ttl, now, prefix)
  local state = redis.call('HMGET', st, 'tok', 'n', 'att', 'ff')
  if state[1] ~= token then
    return {'lost', -1, redis.call('LLEN', buf)}
  end
  local due
  if ok == '1' then
    redis.call('LTRIM', buf, tonumber(state[2]), -1)
    redis.call('HDEL', st, 'tok', 'lu', 'n', 'ra', 'att', 'ff')
    local still = still_buffered(buf)
    forget_events(st, prefix, key, still)
    forget_located(prefix .. 'l:' .. key, prefix, key, still)
  else
    redis.call('HDEL', st, 'tok', 'lu', 'n')
    redis.call('HINCRBY', st, 'att', 1)
    due = now + retry_ms
    local failed = state[4]
    if not failed or (tonumber(state[3]) or 0) == 0 then failed = now end  -- its first failure
    redis.call('HSET', st, 'ra', due, 'ff', failed)
  end
  local buffered = redis.call('LLEN', buf)
  if buffered == 0 then
    redis.call('ZREM', due_key, key)
    redis.call('PEXPIRE', st, idle_ttl)
    return {'done', -1, 0}
  end
  if not due then  -- messages that arrived during the turn: due by their own arrival times
    local first = arrival_of(redis.call('LINDEX', buf, 0))
    local last = tonumber(redis.call('HGET', st, 'last')) or first
    due = due_at(now, buffered, first, last, nil, quiet, max_wait, max_batch)
  end
  redis.call('ZADD', due_key, due, key)
  return {'scheduled', due, buffered}
end

-- db_claim: lease up to ARGV[1] due keys and return their turns; the caller takes the timer
-- for the lane's next due time.
-- KEYS[1] due zset   KEYS[2] armed   KEYS[3] slot guard (never written)
-- ARGV[1] limit   ARGV[2] lease_ms   ARGV[3] max_batch   ARGV[4] token prefix (unique per call)
-- ARGV[5] key name prefix "{P:deb:LANE}:" (buffer = prefix .. "b:" .. key, state = .. "s:")
-- ARGV[6] grace_ms   ARGV[7] the caller's runner id
-- Returns {now_ms, next_due_ms or -1, stale, turn...}.
local function claim(keys, args)
  local now = now_ms()
  local turns, stale = claim_due(keys[1], tonumber(args[1]), tonumber(args[2]),
    tonumber(args[3]), args[4], args[5], now)
  local result = {now, take_timer(keys[1], keys[2], now, tonumber(args[6]), args[7]), stale}
  for _, turn in ipairs(turns) do result[#result + 1] = turn end
  return result
end

-- db_finish: end a claimed turn (see finish_one); a next turn due before the armed time is
-- armed for the caller, whose runner holds its timer.
-- KEYS[1] due zset   KEYS[2] buffer list   KEYS[3] state hash   KEYS[4] armed
-- KEYS[5] the conversation's locators list ({P:deb:LANE}:l:KEY; reached by name as in db_step)
-- ARGV[1] conversation key   ARGV[2] lease token   ARGV[3] "1" if the turn succeeded
-- ARGV[4] retry_in_ms (after a failure)   ARGV[5] quiet_ms   ARGV[6] max_wait_ms
-- ARGV[7] max_batch   ARGV[8] idle_ttl_ms   ARGV[9] grace_ms   ARGV[10] the caller's runner id
-- Returns {outcome, due_ms or -1, buffered}.
local function finish(keys, args)
  local now = now_ms()
  local prefix = string.sub(keys[3], 1, #keys[3] - #args[1] - 2)  -- state = prefix .. 's:' .. key
  local result = finish_one(keys[1], keys[2], keys[3], args[1], args[2], args[3],
    tonumber(args[4]), tonumber(args[5]), tonumber(args[6]), tonumber(args[7]),
    tonumber(args[8]), now, prefix)
  if result[1] == 'scheduled' then
    arm(keys[4], nil, result[2], now, tonumber(args[9]), false, args[10])
  end
  return result
end

-- Keep a step's reply in the list `memo` for `ttl` ms: its token, now, timer, stale, backup,
-- the count of outcomes and the outcomes, then per turn its length and its fields.
local function save_step(memo, token, result, ttl)
  local flat = {token, result[1], result[2], result[3], result[5], #result[4]}
  for _, outcome in ipairs(result[4]) do flat[#flat + 1] = outcome end
  for i = 6, #result do
    flat[#flat + 1] = #result[i]
    for _, field in ipairs(result[i]) do flat[#flat + 1] = field end
  end
  redis.call('DEL', memo)
  for first = 1, #flat, 1000 do  -- a few at a time: unpack's arguments are bounded
    redis.call('RPUSH', memo, unpack(flat, first, math.min(first + 999, #flat)))
  end
  redis.call('PEXPIRE', memo, ttl)
end

-- The reply save_step kept in `memo` for the step of `token`, or nil.
local function saved_step(memo, token)
  if redis.call('LINDEX', memo, 0) ~= token then return nil end
  local flat = redis.call('LRANGE', memo, 1, -1)
  local result = {tonumber(flat[1]), tonumber(flat[2]), tonumber(flat[3]), {}, tonumber(flat[4])}
  local at = 6
  for i = 1, tonumber(flat[5]) do
    result[4][i] = flat[at]
    at = at + 1
  end
  while at <= #flat do
    local turn = {}
    for j = 1, tonumber(flat[at]) do turn[j] = flat[at + j] end
    for j = 3, 5 do turn[j] = tonumber(turn[j]) end  -- attempt, due, first failure
    result[#result + 1] = turn
    at = at + #turn + 1
  end
  return result
end

-- db_step: a runner's one call per wake-up: end the turns it finished, lease what is due.
-- KEYS[1] due zset   KEYS[2] armed   KEYS[3] wake   KEYS[4] slot guard (never written)
-- KEYS[5] the caller's last step ({P:deb:LANE}:step:RUNNER)
-- ARGV[1] limit (0: finish only)   ARGV[2] lease_ms   ARGV[3] max_batch   ARGV[4] token prefix
-- ARGV[5] key name prefix   ARGV[6] grace_ms   ARGV[7] quiet_ms   ARGV[8] max_wait_ms
-- ARGV[9] idle_ttl_ms   ARGV[10] the caller's runner id
-- ARGV[11] pass_at: leasing at least this many turns (0: never) passes the timer on
-- ARGV[12] n finished turns, then per turn: key, token, ok, retry_in_ms
-- Returns {now_ms, timer_ms or -1, stale, {outcome...}, backup_ms or -1, turn...}: with a
-- limit the caller takes the timer for the lane's next due time, unless it leased nothing and
-- another runner already holds a timer for that time or earlier (two runners never keep firing
-- together): then backup_ms is when that runner's hold in `armed` expires, and the caller steps
-- again then (a dead holder's timer is taken over; a live one has re-armed and this step finds
-- it holding the next one); or unless it leased pass_at turns or more: then the next due time
-- goes onto the wake list for the next blocked runner, so a busy lane's turns are spread over
-- the runners; finishing only, it holds a timer for the earliest turn it scheduled before the
-- armed time.
local function step(keys, args)
  local saved = saved_step(keys[5], args[4])
  if saved then return saved end  -- this very call ran already: its reply was lost, not its work
  local now = now_ms()
  local limit, grace = tonumber(args[1]), tonumber(args[6])
  local quiet, max_wait, max_batch = tonumber(args[7]), tonumber(args[8]), tonumber(args[3])
  local idle_ttl, prefix, me = tonumber(args[9]), args[5], args[10]
  local outcomes, timer, backup = {}, -1, -1
  local pass_at = tonumber(args[11])
  for i = 1, tonumber(args[12]) do
    local at = 12 + (i - 1) * 4
    local key = args[at + 1]
    local done = finish_one(keys[1], prefix .. 'b:' .. key, prefix .. 's:' .. key, key,
      args[at + 2], args[at + 3], tonumber(args[at + 4]), quiet, max_wait, max_batch, idle_ttl,
      now, prefix)
    outcomes[i] = done[1]
    if done[1] == 'scheduled' and limit == 0
        and arm(keys[2], nil, done[2], now, grace, false, me) == 1 then
      if timer < 0 or done[2] < timer then timer = done[2] end
    end
  end
  local turns, stale = {}, 0
  if limit > 0 then
    turns, stale = claim_due(keys[1], limit, tonumber(args[2]), max_batch, args[4], prefix, now)
    local armed, owner = armed_of(keys[2])
    local next_due = earliest(keys[1])
    if #turns == 0 and armed and owner ~= '' and owner ~= me and armed > now
        and next_due and armed <= next_due then
      timer = -1  -- another runner holds the timer for the next due time
      backup = redis.call('PEXPIRETIME', keys[2])  -- until then: step again if it died
    elseif pass_at > 0 and #turns >= pass_at and next_due then
      redis.call('SET', keys[2], next_due .. ':', 'PX', math.max(next_due - now, 0) + grace)
      redis.call('LPUSH', keys[3], next_due)
      redis.call('LTRIM', keys[3], 0, WAKE_KEEP)
      timer = -1  -- busy: the next blocked runner takes the timer
    else
      timer = take_timer(keys[1], keys[2], now, grace, me)
    end
  end
  local result = {now, timer, stale, outcomes, backup}
  for _, turn in ipairs(turns) do result[#result + 1] = turn end
  if #turns > 0 or #outcomes > 0 then save_step(keys[5], args[4], result, tonumber(args[2])) end
  return result
end

-- db_wake: hand the timer for due time ARGV[1] to a blocked runner (its holder cannot claim).
-- KEYS[1] wake list   KEYS[2] armed
-- ARGV[1] due_ms   ARGV[2] grace_ms
-- The armed time becomes the wake-up's (no owner), unless an earlier one is armed: the runner
-- the wake-up reaches takes the timer even if its step comes before the due time.
local function wake(keys, args)
  local due = tonumber(args[1])
  local armed = armed_of(keys[2])
  if not armed or armed >= due then
    local now = now_ms()
    redis.call('SET', keys[2], due .. ':', 'PX', math.max(due - now, 0) + tonumber(args[2]))
  end
  redis.call('LPUSH', keys[1], due)
  redis.call('LTRIM', keys[1], 0, WAKE_KEEP)
  return 1
end

-- db_renew: extend the lease of a running turn.
-- KEYS[1] due zset   KEYS[2] state hash
-- ARGV[1] conversation key   ARGV[2] lease token   ARGV[3] lease_ms
-- Returns 1 if the token still held the lease (now extended); -1 if a claim took its turn over
-- after its lease lapsed (the token is in `xt`: another runner runs or ran the turn, whose
-- messages stay buffered until a turn of them succeeds; the caller stops running it); 0
-- otherwise, so that a turn whose state went with Redis's data runs on (its messages may be
-- nowhere else), whether or not a new turn of the conversation has been claimed since. 0 also
-- answers a displacement not recorded: by a claim of an earlier release (which writes no `xt`),
-- more than DISPLACED takeovers ago, or once the idle conversation's state expired.
local function renew(keys, args)
  local state = redis.call('HMGET', keys[2], 'tok', 'xt')
  if state[1] ~= args[2] then
    if state[2] and string.find(state[2], ' ' .. args[2] .. ' ', 1, true) then return -1 end
    return 0
  end
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

-- db_held: which of the given events still wait in the lane's buffers (the ingress's sweeper
-- asks before it replays a webhook of a debounced lane).
-- KEYS[i] {P:deb:LANE}:e:EVENT of each event asked about
-- ARGV[1] key name prefix "{P:deb:LANE}:"   ARGV[2] keep_ms
-- Returns one 1 (held: waiting for its turn, or in its running turn) or 0 per key. The key of a
-- held event is kept at least keep_ms more; that of an event no longer buffered is deleted.
local function held(keys, args)
  local prefix, keep = args[1], tonumber(args[2])
  local found = {}
  for i, index in ipairs(keys) do
    found[i] = 0
    local value = redis.call('GET', index)
    if value then
      local event = string.sub(index, #prefix + 3)
      local _, _, key = located(value)
      local events = redis.call('HGET', prefix .. 's:' .. key, 're')
      if buffered_at(prefix .. 'b:' .. key, events, event, value, key) then
        found[i] = 1
        if redis.call('PTTL', index) < keep then redis.call('PEXPIRE', index, keep) end
      else
        redis.call('DEL', index)
      end
    end
  end
  return found
end

redis.register_function('db_record', record)
redis.register_function('db_held', held)
redis.register_function('db_claim', claim)
redis.register_function('db_finish', finish)
redis.register_function('db_step', step)
redis.register_function('db_wake', wake)
redis.register_function('db_renew', renew)
redis.register_function{function_name = 'db_next', callback = next_due, flags = {'no-writes'}}
