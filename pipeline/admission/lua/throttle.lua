#!lua name=pipeline_throttle
-- Fair concurrency throttles: per-key limits, per-priority FIFO waiter queues, multi-key
-- acquisition in canonical order, direct hand-over of freed slots, leases. Loaded once per process
-- with FUNCTION LOAD REPLACE (pipeline/admission/throttle.py); key names come from
-- pipeline/admission/keys.py.
--
-- Every key of one namespace shares the hash tag {PREFIX:thr:NAMESPACE} (written T below), so a
-- multi-key decision stays in one Redis Cluster slot. KEYS[1] is always T:meta; the function
-- derives every other key from its tag. They all hash to KEYS[1]'s slot, which is what Redis
-- Cluster checks. KEYS[2] is always T:slot_guard, a key never written: while the slot migrates,
-- Redis Cluster refuses (TRYAGAIN) a call declaring a key it does not have, before it runs,
-- instead of stopping it part way at the first key that is missing on that node.
--
--   T:meta        hash   seq: the last arrival sequence handed out (FIFO order of waiters);
--                        shares_at: where thr_prune_shares's HSCAN of T:shares goes on
--   T:limits      hash   throttle key -> concurrency limit (absent: ARGV default_limit)
--   T:shares      hash   throttle key -> "CEILING FLOOR DEDICATED": the org's own part of the
--                        limit the fleet's dynamic limits computed (pipeline/admission/shares.py);
--                        while T:factor exists and the key has a T:limits entry, its limit is
--                        min(MAX_LIMIT, max(FLOOR, floor(CEILING * factor)) + DEDICATED), not
--                        that entry (which holds that limit at the factor of its tick); without
--                        the entry (cleared by a member of an earlier release) the default
--                        (an entry left without one is dropped by thr_prune_shares)
--   T:factor      string the fleet's pressure factor now, set at every tick with a TTL of a few
--                        ticks: absent (no fleet, or a fleet of an earlier release), T:limits rule
--   T:leases      zset   holder -> lease expiry (ms); every permit, holding or waiting, is here
--   T:active      set    throttle keys that have holders or waiters (for status listings)
--   T:p:HOLDER    hash   one permit: member, prio, lease_ms, seq, keys (JSON array, in order),
--                        next (1-based index of the key it waits on or takes next),
--                        state (waiting | granted)
--   T:h:KEY       zset   holders of KEY -> lease expiry (ms); ZCARD is the slots in use
--   T:w:KEY       zset   waiters of KEY -> rank: (1000 - prio) * 1e12 + seq, lowest first, so the
--                        highest priority goes first and FIFO holds within a priority
--   T:g:KEY       list   recent grants of KEY, "HOLDER NOW_MS", newest first, capped at 20;
--                        deleted when KEY has no holder or waiter left (an hour's TTL besides)
--   T:wake:MEMBER list   "HOLDER NOW_MS" for each permit of MEMBER that a hand-over completed;
--                        the member BLPOPs it
--   T:aimd:KEY    hash   an adaptive key's state: limit (a float, the AIMD window), cut_ms (the
--                        last decrease), until (closed by a Retry-After up to this time, ms)
--   T:closed      zset   adaptive keys closed by a Retry-After -> reopening time (ms); their
--                        limit is 0 meanwhile, and every call reopens those that are due
--   T:reserve     hash   throttle key -> "SLOTS:MIN_PRIO": the last SLOTS of the key's limit
--                        are kept for permits of priority >= MIN_PRIO (trunk reservation);
--                        lower priorities see the limit minus SLOTS
--   T:reserved    hash   throttle key -> permits of its reserve's priorities that asked for it
--                        while it kept a reserve; T:reserved_queued: those of them that queued
--                        (found no room), so the two give the measured P(wait) of the reserve
--
-- A permit's *room* on a key is its limit, less the key's reserve if the permit's priority is
-- below the reserve's. Invariant after every call: a key has waiters only while its holders
-- fill the room of its best waiter, so a newcomer of no better priority queues behind them (no
-- barging) and a freed slot never stays idle while a waiter has room for it.
-- A permit holds a prefix of its keys in the canonical order and waits on the next one: the
-- waits-for graph only points to later keys, so it has no cycles (no deadlock), and a waiter is
-- never bounced
-- (no livelock). Every call first expires lapsed leases (at most 64 a call) and hands their
-- slots on, so a killed holder's slots return within its lease.

local MAX_PRIORITY = 1000
local SEQ_SPAN = 1e12
local GRANTS_KEPT = 20
local GRANTS_TTL_MS = 3600000  -- a backstop: the history goes when its key is idle (forget_if_idle)
local EXPIRE_BATCH = 64
local MAX_LIMIT = 2147483647  -- the largest limit a throttle takes (shares.py MAX_LIMIT)

-- The calling member and the permits of it that this call completed: they are returned to the
-- caller instead of pushed onto its own wake list (one round trip less, no wake latency).
-- factor: the fleet's pressure factor (T:factor), read once a call at its first limit (nil: not
-- read yet, false: none).
local call = {member = '', woken = {}, factor = nil}

local function begin_call(member)
  call.member = member
  call.woken = {}
  call.factor = nil
end

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function tag_of(meta)
  return string.sub(meta, 1, -6)  -- strip ":meta"
end

local function fleet_factor(tag)
  if call.factor == nil then
    local f = tonumber(redis.call('GET', tag .. ':factor') or '')
    local finite = f and f == f and f ~= math.huge and f ~= -math.huge
    call.factor = finite and f or false
  end
  return call.factor
end

-- KEY's limit: the default without a T:limits entry; else its share at the fleet's factor now,
-- where the fleet set both; else that entry. A share is applied at every admission, so an org
-- the capped tick did not reach again shrinks (or grows) with the fleet at once rather than when
-- it is reached. A share counts only beside a limit: a member of an earlier release clears a
-- gone org's limit and knows no share, which must not outlive it. A key without a limit (sub:,
-- job:, most keys) costs one HGET, as before shares.
local function limit_of(tag, key, default_limit)
  local v = redis.call('HGET', tag .. ':limits', key)
  if not v then return default_limit end
  local factor = fleet_factor(tag)
  if factor then
    local share = redis.call('HGET', tag .. ':shares', key)
    local top, floor, dedicated = string.match(share or '', '^(%d+) (%d+) (%d+)$')
    if top then
      local scaled = math.max(tonumber(floor), math.floor(tonumber(top) * factor))
      return math.min(MAX_LIMIT, scaled + tonumber(dedicated))
    end
  end
  return tonumber(v)
end

local function load_permit(tag, holder)
  local flat = redis.call('HGETALL', tag .. ':p:' .. holder)
  if #flat == 0 then return nil end
  local p = {}
  for i = 1, #flat, 2 do p[flat[i]] = flat[i + 1] end
  p.keys = cjson.decode(p.keys)
  p.next = tonumber(p.next)
  p.lease_ms = tonumber(p.lease_ms)
  return p
end

-- KEY's reserve as {slots, min_prio}, or false when it keeps none.
local function reserve_of(tag, key)
  local reserve = redis.call('HGET', tag .. ':reserve', key)
  if not reserve then return false end
  local slots, min_prio = string.match(reserve, '^(%d+):(%d+)$')
  return {slots = tonumber(slots), min_prio = tonumber(min_prio)}
end

-- The slots of KEY a permit of priority `prio` may fill: the limit, less the reserve kept
-- for better priorities. `reserve`: KEY's, if the caller read it already (reserve_of).
local function room_of(tag, key, prio, default_limit, reserve)
  if reserve == nil then reserve = reserve_of(tag, key) end
  local limit = limit_of(tag, key, default_limit)
  if reserve and prio < reserve.min_prio then return limit - reserve.slots end
  return limit
end

-- The priority of KEY's best waiter, or nil.
local function best_waiter(tag, key)
  local head = redis.call('ZRANGE', tag .. ':w:' .. key, 0, 0, 'WITHSCORES')
  if not head[1] then return nil, nil end
  return head[1], MAX_PRIORITY - math.floor(tonumber(head[2]) / SEQ_SPAN)
end

-- Count a permit of the reserve's priorities asking for KEY (and whether it queued), given
-- KEY's reserve (reserve_of).
local function count_reserved(tag, key, prio, reserve, queued)
  if not reserve or prio < reserve.min_prio then return end
  redis.call('HINCRBY', tag .. ':reserved', key, 1)
  if queued then redis.call('HINCRBY', tag .. ':reserved_queued', key, 1) end
end

-- `reserve` as for room_of.
local function can_take(tag, key, default_limit, prio, reserve)
  local _, waiting_prio = best_waiter(tag, key)
  if waiting_prio and waiting_prio >= prio then return false end
  local held = redis.call('ZCARD', tag .. ':h:' .. key)
  return held < room_of(tag, key, prio, default_limit, reserve)
end

local function grant_slot(tag, key, holder, expiry, now)
  redis.call('ZADD', tag .. ':h:' .. key, expiry, holder)
  redis.call('SADD', tag .. ':active', key)
  local g = tag .. ':g:' .. key
  redis.call('LPUSH', g, holder .. ' ' .. now)
  redis.call('LTRIM', g, 0, GRANTS_KEPT - 1)
  redis.call('PEXPIRE', g, GRANTS_TTL_MS)
end

-- Take the permit's keys from p.next on while they have room; queue on the first full one.
-- Returns true when the permit holds all its keys.
local function advance(tag, holder, p, now, default_limit)
  local expiry = now + p.lease_ms
  while p.next <= #p.keys do
    local key = p.keys[p.next]
    local reserve = reserve_of(tag, key)  -- read once: for the room and for the counts
    if not can_take(tag, key, default_limit, tonumber(p.prio), reserve) then
      local rank = (MAX_PRIORITY - tonumber(p.prio)) * SEQ_SPAN + tonumber(p.seq)
      redis.call('ZADD', tag .. ':w:' .. key, rank, holder)
      redis.call('SADD', tag .. ':active', key)
      redis.call('HSET', tag .. ':p:' .. holder, 'next', p.next, 'state', 'waiting')
      count_reserved(tag, key, tonumber(p.prio), reserve, true)
      return false
    end
    count_reserved(tag, key, tonumber(p.prio), reserve, false)
    grant_slot(tag, key, holder, expiry, now)
    p.next = p.next + 1
  end
  redis.call('HSET', tag .. ':p:' .. holder, 'next', p.next, 'state', 'granted')
  return true
end

-- A key with no holder and no waiter left is forgotten, its grant history with it: a tenant, a
-- sub-tenant or a document seen once leaves nothing behind. Kept for the hour of its TTL, the
-- history of a million one-message tenants held some 350 MB with nothing held or waiting.
local function forget_if_idle(tag, key)
  if redis.call('ZCARD', tag .. ':h:' .. key) == 0 and redis.call('ZCARD', tag .. ':w:' .. key) == 0 then
    redis.call('SREM', tag .. ':active', key)
    redis.call('DEL', tag .. ':g:' .. key)
  end
end

-- Hand free slots of KEY to its waiters, best rank first, continuing each one's acquisition.
-- Returns how many waiters became fully granted (and were woken).
local function pump(tag, key, now, default_limit)
  local woken = 0
  local holders, waiters = tag .. ':h:' .. key, tag .. ':w:' .. key
  while true do
    local head, prio = best_waiter(tag, key)
    if not head then break end
    if redis.call('ZCARD', holders) >= room_of(tag, key, prio, default_limit) then break end
    redis.call('ZREM', waiters, head)
    local p = load_permit(tag, head)
    if p then
      grant_slot(tag, key, head, now + p.lease_ms, now)
      p.next = p.next + 1
      if advance(tag, head, p, now, default_limit) then
        if p.member == call.member then
          call.woken[#call.woken + 1] = head .. ' ' .. now
        else
          local wake = tag .. ':wake:' .. p.member
          redis.call('LPUSH', wake, head .. ' ' .. now)
          redis.call('PEXPIRE', wake, math.max(60000, 2 * p.lease_ms))
        end
        woken = woken + 1
      end
    end
  end
  forget_if_idle(tag, key)
  return woken
end

-- Remove a permit (holding or waiting) and hand the slots it held on. Returns slots freed.
local function drop(tag, holder, now, default_limit)
  local p = load_permit(tag, holder)
  redis.call('ZREM', tag .. ':leases', holder)
  if not p then return 0 end
  redis.call('DEL', tag .. ':p:' .. holder)
  local held = p.next - 1
  if p.state == 'waiting' and p.next <= #p.keys then
    redis.call('ZREM', tag .. ':w:' .. p.keys[p.next], holder)
    forget_if_idle(tag, p.keys[p.next])
  end
  for i = 1, held do
    redis.call('ZREM', tag .. ':h:' .. p.keys[i], holder)
  end
  for i = 1, held do
    pump(tag, p.keys[i], now, default_limit)
  end
  return held
end

local function expire_lapsed(tag, now, default_limit)
  local lapsed = redis.call('ZRANGEBYSCORE', tag .. ':leases', '-inf', now, 'LIMIT', 0, EXPIRE_BATCH)
  for _, holder in ipairs(lapsed) do
    drop(tag, holder, now, default_limit)
  end
  -- Adaptive keys whose Retry-After has passed get their window back.
  local due = redis.call('ZRANGEBYSCORE', tag .. ':closed', '-inf', now, 'LIMIT', 0, EXPIRE_BATCH)
  for _, key in ipairs(due) do
    redis.call('ZREM', tag .. ':closed', key)
    local window = tonumber(redis.call('HGET', tag .. ':aimd:' .. key, 'limit') or '1')
    redis.call('HSET', tag .. ':limits', key, math.max(1, math.floor(window)))
    redis.call('HDEL', tag .. ':aimd:' .. key, 'until')
    pump(tag, key, now, default_limit)
  end
  return #lapsed
end

-- AIMD on an adaptive key (a downstream dependency), from one finished job's outcome:
-- ok grows the window by 1/window (one slot per window of successes); slow or throttled shrink
-- it by the factor, at most once per cooldown (one congestion event, not one per job in
-- flight); a Retry-After closes the key (limit 0) until then. The whole fleet shares the state.
-- f: {key, outcome, retry_after_ms, min, max, decrease (0..1), cooldown_ms}
local function adapt(tag, f, now, default_limit)
  local key, outcome = f[1], f[2]
  local retry_after, lo, hi = tonumber(f[3]), tonumber(f[4]), tonumber(f[5])
  local decrease, cooldown = tonumber(f[6]), tonumber(f[7])
  local state = tag .. ':aimd:' .. key
  local window = tonumber(redis.call('HGET', state, 'limit') or '0')
  if window <= 0 then window = math.min(hi, math.max(lo, limit_of(tag, key, default_limit))) end
  if outcome == 'ok' then
    window = math.min(hi, window + 1 / window)
  else
    local cut = tonumber(redis.call('HGET', state, 'cut_ms') or '0')
    if now - cut >= cooldown then
      window = math.max(lo, window * decrease)
      redis.call('HSET', state, 'cut_ms', now)
    end
  end
  window = math.max(lo, math.min(hi, window))
  redis.call('HSET', state, 'limit', tostring(window))
  redis.call('HDEL', tag .. ':shares', key)  -- the window, not a fleet share, is its limit now
  if outcome == 'throttled' and retry_after > 0 then
    local until_ms = now + retry_after
    local closed = tonumber(redis.call('ZSCORE', tag .. ':closed', key) or '0')
    if until_ms > closed then
      redis.call('ZADD', tag .. ':closed', until_ms, key)
      redis.call('HSET', state, 'until', until_ms)
    end
    redis.call('HSET', tag .. ':limits', key, 0)
  elseif not redis.call('ZSCORE', tag .. ':closed', key) then
    redis.call('HSET', tag .. ':limits', key, math.floor(window))
  end
end

local function unique(list)
  local out, seen = {}, {}
  for _, k in ipairs(list) do
    if not seen[k] then
      seen[k] = true
      out[#out + 1] = k
    end
  end
  return out
end

-- thr_acquire: ask for a slot on every key of a job, in one step.
-- KEYS[1] T:meta   KEYS[2] T:slot_guard
-- ARGV[1] holder id (unique per acquisition)   ARGV[2] member id   ARGV[3] priority 0..1000
-- ARGV[4] lease_ms   ARGV[5] default_limit   ARGV[6] "1": try only (never queue)
-- ARGV[7..] the throttle keys in the canonical order (throttle.py canonical_order: narrowest
--           scope first, then by name), which every member uses; duplicates are dropped
-- Returns {state, held, woken}: state is granted | waiting | busy (try only: nothing taken);
-- held is how many keys the permit holds; woken lists "HOLDER NOW_MS" of the caller's permits
-- that lapsed leases handed slots to (every function returns these). Calling again with the
-- same holder returns its state.
local function acquire(keys, args)
  local tag = tag_of(keys[1])
  local holder, member, prio = args[1], args[2], tonumber(args[3])
  local lease_ms, default_limit, try_only = tonumber(args[4]), tonumber(args[5]), args[6] == '1'
  begin_call(member)
  local now = now_ms()
  expire_lapsed(tag, now, default_limit)
  local existing = load_permit(tag, holder)
  if existing then return {existing.state, existing.next - 1, call.woken} end
  if prio < 0 or prio > MAX_PRIORITY then return redis.error_reply('priority must be 0..1000') end
  local wanted = {}
  for i = 7, #args do wanted[#wanted + 1] = args[i] end
  wanted = unique(wanted)
  if try_only then
    for _, key in ipairs(wanted) do
      if not can_take(tag, key, default_limit, prio) then return {'busy', 0, call.woken} end
    end
  end
  local seq = redis.call('HINCRBY', keys[1], 'seq', 1)
  local p = {member = member, prio = prio, lease_ms = lease_ms, seq = seq, keys = wanted, next = 1}
  redis.call('HSET', tag .. ':p:' .. holder, 'member', member, 'prio', prio,
    'lease_ms', lease_ms, 'seq', seq, 'keys', cjson.encode(wanted), 'next', 1, 'state', 'waiting')
  redis.call('ZADD', tag .. ':leases', now + lease_ms, holder)
  local done = advance(tag, holder, p, now, default_limit)
  return {done and 'granted' or 'waiting', p.next - 1, call.woken}
end

-- thr_release: give up a permit (held or still waiting); its slots go to the next waiters.
-- KEYS[1] T:meta   KEYS[2] T:slot_guard   ARGV[1] holder id   ARGV[2] default_limit
-- ARGV[3] calling member id
-- ARGV[4..] feedback on adaptive keys, 7 values each (see adapt), applied first, so the freed
--           slots go out under the new limits
-- Returns {freed, woken}: slots freed (0 if the permit was unknown: already expired or
-- released) and the caller's own permits completed by the hand-over.
local function release(keys, args)
  local tag, default_limit = tag_of(keys[1]), tonumber(args[2])
  begin_call(args[3])
  local now = now_ms()
  expire_lapsed(tag, now, default_limit)
  for i = 4, #args, 7 do
    adapt(tag, {unpack(args, i, i + 6)}, now, default_limit)
  end
  local freed = drop(tag, args[1], now, default_limit)
  return {freed, call.woken}
end

-- thr_renew: extend the leases of a member's live permits (its heartbeat).
-- KEYS[1] T:meta   KEYS[2] T:slot_guard   ARGV[1] default_limit   ARGV[2] calling member id
-- ARGV[3..] holder ids
-- Returns {letters, woken}: one letter per holder, g (granted) | w (waiting) | x (unknown:
-- expired or state lost).
local function renew(keys, args)
  local tag, default_limit = tag_of(keys[1]), tonumber(args[1])
  begin_call(args[2])
  local now = now_ms()
  expire_lapsed(tag, now, default_limit)
  local out = {}
  for i = 3, #args do
    local holder = args[i]
    local p = load_permit(tag, holder)
    if not p then
      out[#out + 1] = 'x'
    else
      local expiry = now + p.lease_ms
      redis.call('ZADD', tag .. ':leases', expiry, holder)
      for j = 1, p.next - 1 do
        redis.call('ZADD', tag .. ':h:' .. p.keys[j], 'XX', expiry, holder)
      end
      out[#out + 1] = (p.state == 'granted') and 'g' or 'w'
    end
  end
  return {table.concat(out), call.woken}
end

-- thr_set_limit: set (or with an empty ARGV[2], clear) a key's limit and hand out new room.
-- KEYS[1] T:meta   KEYS[2] T:slot_guard   ARGV[1] throttle key   ARGV[2] limit or ""
-- ARGV[3] default_limit
-- ARGV[4] calling member id
-- Returns {woken_count, woken}: waiters completed, and those of them that are the caller's.
-- `share`: the key's share from the fleet (thr_set_shares), or nil: a plain limit, whose key
-- keeps no share (an operator's limit rules over the fleet's until its next tick sets it again).
local function put_limit(tag, key, value, share)
  if value == '' then
    redis.call('HDEL', tag .. ':limits', key)
  else
    redis.call('HSET', tag .. ':limits', key, tonumber(value))
  end
  if share then
    redis.call('HSET', tag .. ':shares', key, share)
  else
    redis.call('HDEL', tag .. ':shares', key)
  end
  -- An adaptive key starts its window again from what the operator set, and opens now.
  redis.call('DEL', tag .. ':aimd:' .. key)
  redis.call('ZREM', tag .. ':closed', key)
end

local function set_limit(keys, args)
  local tag, key, default_limit = tag_of(keys[1]), args[1], tonumber(args[3])
  begin_call(args[4])
  put_limit(tag, key, args[2])
  local now = now_ms()
  expire_lapsed(tag, now, default_limit)
  local count = pump(tag, key, now, default_limit)
  return {count, call.woken}
end

-- Puts the limits (and shares) of ARGV[3..], `stride` values a key, then hands the new room of
-- each key to its waiters. KEYS and ARGV[1..2] as thr_set_limits.
local function put_limits(keys, args, stride)
  local tag, default_limit = tag_of(keys[1]), tonumber(args[1])
  begin_call(args[2])
  for i = 3, #args, stride do
    put_limit(tag, args[i], args[i + 1], stride == 3 and args[i + 2] or nil)
  end
  local now = now_ms()
  expire_lapsed(tag, now, default_limit)
  local count = 0
  for i = 3, #args, stride do count = count + pump(tag, args[i], now, default_limit) end
  return {count, call.woken}
end

-- thr_set_limits: thr_set_limit for many keys in one call (the fleet's dynamic limits, one
-- call per batch of orgs rather than one per org).
-- KEYS[1] T:meta   KEYS[2] T:slot_guard   ARGV[1] default_limit   ARGV[2] calling member id
-- ARGV[3..] pairs of throttle key and limit (or "")
-- Returns {woken_count, woken} as thr_set_limit.
local function set_limits(keys, args)
  return put_limits(keys, args, 2)
end

-- thr_set_shares: thr_set_limits for the fleet's dynamic limits, each key with its share.
-- KEYS[1] T:meta   KEYS[2] T:slot_guard   ARGV[1] default_limit   ARGV[2] calling member id
-- ARGV[3..] triples of throttle key, limit (at the tick's factor, for T:limits) and share
--           ("CEILING FLOOR DEDICATED", integers)
-- Returns {woken_count, woken} as thr_set_limit.
local function set_shares(keys, args)
  for i = 3, #args, 3 do
    if not string.match(args[i + 2], '^%d+ %d+ %d+$') then
      return redis.error_reply('share must be "CEILING FLOOR DEDICATED" (got ' .. args[i + 2] .. ')')
    end
  end
  return put_limits(keys, args, 3)
end

-- thr_set_reserve: keep (or with an empty ARGV[2], stop keeping) the last slots of a key for
-- permits of priority >= ARGV[3]; room a smaller reserve frees goes to the waiters.
-- KEYS[1] T:meta   KEYS[2] T:slot_guard   ARGV[1] throttle key   ARGV[2] slots or ""
-- ARGV[3] min priority
-- ARGV[4] default_limit   ARGV[5] calling member id
-- Returns {woken_count, woken} as thr_set_limit.
local function set_reserve(keys, args)
  local tag, key, default_limit = tag_of(keys[1]), args[1], tonumber(args[4])
  begin_call(args[5])
  if args[2] == '' then
    redis.call('HDEL', tag .. ':reserve', key)
  else
    redis.call('HSET', tag .. ':reserve', key, tonumber(args[2]) .. ':' .. tonumber(args[3]))
  end
  local now = now_ms()
  expire_lapsed(tag, now, default_limit)
  local count = pump(tag, key, now, default_limit)
  return {count, call.woken}
end

-- thr_prune_shares: drop the shares of keys without a limit, PRUNED_A_CALL fields of T:shares
-- a call, going on from where the last call stopped (T:meta shares_at). A member of an earlier
-- release that forgets a gone org clears its limit and knows no share: a share counts only
-- beside a limit (limit_of), and this removes the entry left behind, which nothing else would
-- (the org is gone from the window too). The fleet's tick calls it once.
-- KEYS[1] T:meta   KEYS[2] T:slot_guard
-- Returns the number of shares dropped.
local PRUNED_A_CALL = 500
local function prune_shares(keys, args)
  local tag = tag_of(keys[1])
  local at = redis.call('HGET', keys[1], 'shares_at') or '0'
  local scan = redis.call('HSCAN', tag .. ':shares', at, 'COUNT', PRUNED_A_CALL)
  local fields, dropped = scan[2], 0
  for i = 1, #fields, 2 do
    if redis.call('HEXISTS', tag .. ':limits', fields[i]) == 0 then
      redis.call('HDEL', tag .. ':shares', fields[i])
      dropped = dropped + 1
    end
  end
  if scan[1] == '0' then
    redis.call('HDEL', keys[1], 'shares_at')
  else
    redis.call('HSET', keys[1], 'shares_at', scan[1])
  end
  return dropped
end

redis.register_function('thr_acquire', acquire)
redis.register_function('thr_release', release)
redis.register_function('thr_renew', renew)
redis.register_function('thr_set_limit', set_limit)
redis.register_function('thr_set_limits', set_limits)
redis.register_function('thr_set_shares', set_shares)
redis.register_function('thr_set_reserve', set_reserve)
redis.register_function('thr_prune_shares', prune_shares)
