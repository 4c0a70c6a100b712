#!lua name=pipeline_guard
-- The run guard of the consumer runtime (pipeline/retry/guard_store.py): start marks for poison
-- detection, and per-key parking that keeps order across retry tiers, with parked followers held
-- here until their head finishes. Every key of one lane shares the hash tag {P:guard:LANE}, so
-- every call stays in one Redis Cluster slot; the calls that reach a parked key's own keys
-- (T:z:K, T:h:K, T:f:K) beyond their KEYS build those names from the lane's tag (ARGV tag, or
-- the tag of KEYS[1]), never another's.
--
-- Lane-wide keys (T = {P:guard:LANE}):
--   T:run     hash  message id -> start mark "starts|position[|attempt]": a start that has not
--                   ended. position is where that copy was read (topic:partition:offset), or
--                   "rel" for a held follower released from here; attempt, when present, is the
--                   attempt of the retry copy this start is producing (gd_route): that copy may
--                   take the mark over, no other may. A mark of 0 starts ("0|position|attempt")
--                   is left by a start that ended once its retry copy was produced: that copy
--                   takes it over, and the copy at position, delivered again (its offset was
--                   not committed yet), is stale
--   T:alone   hash  message id -> lone starts of a suspect (its runs alone after a crash)
--   T:gone    zset  message id -> when it left a parked key (handled or dead-lettered), by the
--                   lane's clock: a copy of it that shows up again is stale. Entries older than
--                   ttl_ms by that clock are pruned (gd_reap). Two more entries keep the clock:
--                   @at, the Redis time of the lane's last gd_reap, and @off, how long (ms) no
--                   member reaped the lane, past a lease, in all. The lane's clock is Redis's
--                   less @off: it stands still while every member is down, so an outage does not
--                   age the entries
--   T:parked  hash  key -> 1 while the key has parked messages (the batch call's index)
--   T:rel     zset  key -> lease expiry ms (Redis clock) of a release in progress (gd_reap takes
--                   over late ones, even after every member was down for days)
--   T:claims:TOPIC:P  hash  instance -> "lo|hi": the offsets of a main partition that member
--                   process claimed (pipeline/runtime/claims.py); "@owner" -> the instance the
--                   partition was assigned to last (gd_take), until it gives its claim up
--                   (gd_unclaim). A claim is only written again while no other instance is the
--                   owner (gd_claim)
-- Per parked key K (base64):
--   T:z:K     zset  parked message id -> sequence; the lowest is the key's head
--   T:h:K     hash  seq (last sequence given), dead_until (followers up to this sequence follow a
--                   dead-lettered head), rel (the first follower of the release in
--                   progress), by (the member process that holds that release: ends of its
--                   followers from any other one release nothing more), below (where the key
--                   was parked from a main topic, "topic:partition:offset": the lowest offset
--                   of the key that member had not finished on that partition; every earlier
--                   message of the key it read there had finished, so a delivery from that
--                   partition below it, not in T:z:K, is a copy read again after a crash
--                   before its offset was committed: stale, not held behind the head)
--   T:f:K     hash  message id -> the held follower (encoded message): it waits here, written
--                   once, until the messages ahead of it finished
-- Every key expires, so state of vanished messages frees itself: ARGV hold_ms after its last
-- change (the lane's retention plus ttl_ms, the retry path plus an hour), since what it holds
-- is read again when copies come back after a consumer outage of days (while a tier or the
-- main topic keeps them), when nothing changed these keys. A parked key's state (T:z:K, T:h:K,
-- T:f:K, T:parked, T:rel) runs its held followers, whose offsets are committed: Redis holds
-- their only copy. It is deleted as soon as the key has nothing parked (release_next,
-- gd_key_begin), so the longer bound costs memory only for keys that still wait. Every write
-- of a key's state renews T:parked and T:rel with it (keep_key), and gd_reap renews them
-- while any member runs: neither index expires before a key's state it points to. The marks
-- (T:run) and lone-start counts (T:alone) make a delivery read again after the outage stale
-- (a start that produced its retry copy) or a suspect whose crashes count; gd_reap renews
-- them while any member runs, so their bound counts only while every member is down. T:gone
-- is trimmed to the entries younger than ARGV ttl_ms by the lane's clock, which stands still
-- through an outage (it grows with every message that leaves a parked key). The claims expire
-- as the marks do, ARGV hold_ms after their last write (renewed at every tick of their
-- member): a crashed member's claim is what makes the partition's next owner, perhaps back
-- only after the outage, take the exact path over the range it may have been running.
-- T:live expires twice the liveness after its last write.
-- The batch call reads and writes with one multi-field command per kind, so its cost in Redis
-- commands does not grow with the number of starts it carries.
--
-- Decisions returned to the runtime:
--   process    run the handler
--   suspect    an earlier start of this copy never ended: run it alone, after gd_solo
--   copy       another copy of this message started and has not ended, or this copy ended and its
--              retry copy is due: drop this one (the other copy either finishes or, not
--              committed, is delivered again)
--   stale      this message already left its key's parked set, or it was read from the partition
--              its key was parked from, below where it was (T:h:K below), and is not in the
--              parked set: a late duplicate, drop it
--   slow       (gd_begin only) the key is parked: ask gd_key_begin
--   held       the key is parked: the message is stored here behind its head; its offset is done
--   sequenced  it follows a dead-lettered head: dead-letter it without running

local CHUNK = 1000  -- arguments per multi-field command (Lua's stack has a limit)

-- Every time here (liveness, release leases, when a message left its key) is Redis's own
-- clock (TIME), never a member's: members on hosts whose clocks disagree judge each other alike.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function bulk(command, key, items)
  local out = {}
  for i = 1, #items, CHUNK do
    local part = redis.call(command, key, unpack(items, i, math.min(i + CHUNK - 1, #items)))
    if type(part) == 'table' then
      for _, v in ipairs(part) do out[#out + 1] = v end
    end
  end
  return out
end

-- A mark is "starts|position[|route[|instance]]": route is the attempt of the retry copy its
-- start was producing (empty if none), instance the member process that made the start (empty
-- for a released follower's: its release has a lease of its own).
local function parse(mark)
  local starts, pos, route, inst = string.match(mark, '^(%d+)|([^|]*)|?(%d*)|?([^|]*)$')
  return tonumber(starts), pos, route, inst
end

-- Whether the member process `inst` renewed its liveness (gd_live) and it has not run out.
local function live(live_key, inst, now)
  if not inst or inst == '' or not live_key then return false end
  local until_ms = tonumber(redis.call('HGET', live_key, inst) or '0')
  return until_ms > now
end

-- Decide a start of `id` read at `pos` (attempt `attempt`) given its current mark (or false).
-- With `force`, a mark of another position is taken over as a suspect. `me` is the calling
-- member process (written into the mark; nil for a release), `live_key` and `now` let a
-- mark of this position made by another process that is still alive answer `busy`: that process
-- still runs it (it lost the partition to a stall, not to a crash), so this copy must wait for
-- its end instead of running beside it. Returns decision, starts, and the new mark (nil:
-- unchanged).
local function decide(mark, pos, attempt, force, me, live_key, now)
  local tail = me and ('||' .. me) or ''
  if not mark then return 'process', 1, '1|' .. pos .. tail end
  local starts, at, route, inst = parse(mark)
  if at ~= pos and route ~= '' and route == attempt then
    return 'process', 1, '1|' .. pos .. tail  -- the retry copy its start was producing: it takes over
  end
  if starts == 0 and not force then return 'copy', 0, nil end  -- ended: its retry copy runs
  if at == pos and me and inst ~= me and live(live_key, inst, now) then
    return 'busy', starts, nil
  end
  if at == pos or force then
    return 'suspect', starts + 1, (starts + 1) .. '|' .. pos .. tail
  end
  return 'copy', starts, nil
end

local function mark_start(run, id, pos, attempt, force, me, live_key, now)
  local decision, starts, mark = decide(redis.call('HGET', run, id), pos, attempt, force, me,
                                        live_key, now)
  if mark then redis.call('HSET', run, id, mark) end
  return decision, starts
end

-- Parse "id TAB position[ TAB 1]" lines (an empty position is the id itself; 1: the start's
-- retry copy was produced) into ids, positions and routed flags.
local function end_lines(lines)
  local ids, positions, routed = {}, {}, {}
  for id, pos, r in string.gmatch(lines, '([^\t\n]+)\t([^\t\n]*)\t?(1?)') do
    ids[#ids + 1] = id
    positions[#positions + 1] = pos == '' and id or pos
    routed[#routed + 1] = r == '1'
  end
  return ids, positions, routed
end

-- What the mark of a start that ended at `pos` becomes: 0 starts, if the start routed its retry
-- copy (its mark names the copy's attempt) and that copy was produced (`produced`), else none.
local function ended_mark(route, pos, produced)
  if produced and route ~= '' then return '0|' .. pos .. '|' .. route end
  return false
end

-- End the marks (and lone-start counts) of ended starts whose mark is still theirs: deleted, or
-- left for a produced retry copy to take over (ended_mark). `marks` holds their current marks,
-- read with the starts' in one HMGET. Only a suspect (a mark of more than one start) can have a
-- lone-start count. Returns id -> the mark it has now (false: none) for the ends applied.
local function end_marks(run, alone, ids, positions, routed, marks)
  local done, kept, lone, ended = {}, {}, {}, {}
  for i, id in ipairs(ids) do
    local mark = marks[i]
    if mark then
      local starts, at, route = parse(mark)
      if at == positions[i] and starts > 0 then
        local left = ended_mark(route, at, routed[i])
        if left then
          kept[#kept + 1] = id
          kept[#kept + 1] = left
        else
          done[#done + 1] = id
        end
        ended[id] = left
        if starts > 1 then lone[#lone + 1] = id end
      end
    end
  end
  if #done > 0 then bulk('HDEL', run, done) end
  if #kept > 0 then bulk('HSET', run, kept) end
  if #lone > 0 then bulk('HDEL', alone, lone) end
  return ended
end

-- PEXPIRE each key: `ms` as ARGV gave it (a string; a Lua number past 2^53 would reach Redis
-- in exponent form, which PEXPIRE refuses).
local function expire(ms, ...)
  for _, key in ipairs({...}) do redis.call('PEXPIRE', key, ms) end
end

-- Add the names of parked key K's state (T:z:K, T:h:K, T:f:K) to `k`, for the calls that
-- reach several keys of the lane (all under the tag T, so in one Cluster slot).
local function of_key(k, tag, key)
  k.z, k.h, k.f = tag .. ':z:' .. key, tag .. ':h:' .. key, tag .. ':f:' .. key
  return k
end

-- The lane's tag T, from the name of one of its lane-wide keys (T:run, T:rel, ...).
local function tag_of(name)
  return string.match(name, '^(.*):[^:]+$')
end

-- A parked key's state was written: it, and the lane-wide keys that index it (T:parked, by
-- which a new message of the key is held behind it; T:rel, by which a release whose member
-- died is taken over), expire `hold_ms` from now. Every write of a key's state renews both
-- (gd_reap too, while any member runs), so neither can expire before a key's state it points
-- to: a T:parked gone first would let a new message of the key run ahead of its held
-- followers, a T:rel gone first would leave a release nobody takes over, its followers held
-- until their state expires. k: z, h, f, parked, rel.
local function keep_key(hold_ms, k)
  expire(hold_ms, k.z, k.h, k.f, k.parked, k.rel)
end

-- The entries of T:gone that keep the lane's clock (no message id has this form).
local CLOCK_AT, CLOCK_OFF = '@at', '@off'

-- The lane's clock at Redis's `now`: T:gone's entries are scored and pruned by it.
local function lane_now(gone, now)
  return now - tonumber(redis.call('ZSCORE', gone, CLOCK_OFF) or '0')
end

-- Drop heads of a parked key that already finished (a copy re-parked them); the head or nil.
local function live_head(gone, z, f)
  local head = redis.call('ZRANGE', z, 0, 0, 'WITHSCORES')
  while head[1] and redis.call('ZSCORE', gone, head[1]) do
    redis.call('ZREM', z, head[1])
    redis.call('HDEL', f, head[1])
    head = redis.call('ZRANGE', z, 0, 0, 'WITHSCORES')
  end
  return head[1], tonumber(head[2])
end

-- Whether offset text `a` is below `b` (both decimal, no leading zeros; compared as text, so
-- that offsets past 2^53 compare exactly).
local function below_offset(a, b)
  if #a ~= #b then return #a < #b end
  return a < b
end

-- Whether the start of `id` read at `pos` is a copy read again from below where its parked key
-- was parked (T:h:K below, on the same topic and partition), not one of the key's parked
-- messages: that member had finished every message of the key there below it. k: z, h.
local function below_parking(k, id, pos)
  local at = redis.call('HGET', k.h, 'below')
  if not at then return false end
  local where, offset = string.match(at, '^(.*):(%d+)$')
  local here, mine = string.match(pos, '^(.*):(%d+)$')
  if not where or where ~= here or not below_offset(mine, offset) then return false end
  return not redis.call('ZSCORE', k.z, id)
end

-- Hold `id` (its encoded message `blob`) behind the live head of its parked key: written once
-- into T:f:K, in its turn in T:z:K. k: gone, parked, rel, z, h, f. Returns 'copy' if it is held
-- already (its release runs it), 'held', or nil when the key has no live head or `id` is the
-- head itself (gd_key_begin decides those). `hold_ms`: the per-key state's expiry.
local function hold(k, hold_ms, id, key, blob)
  local head = live_head(k.gone, k.z, k.f)
  if not head then return nil end
  if redis.call('HEXISTS', k.f, id) == 1 then return 'copy' end
  if head == id then return nil end
  if not redis.call('ZSCORE', k.z, id) then
    redis.call('ZADD', k.z, redis.call('HINCRBY', k.h, 'seq', 1), id)
  end
  redis.call('HSET', k.f, id, blob)
  keep_key(hold_ms, k)
  return 'held'
end

-- gd_begin: end the given starts, then decide a batch of starts, in one call.
-- KEYS[1] T:run   KEYS[2] T:gone   KEYS[3] T:parked   KEYS[4] T:alone   KEYS[5] T:live
-- ARGV[1] hold_ms (the expiry of the per-key state of held starts, of T:parked and T:rel;
-- gd_reap keeps the lane-wide hashes' expiry)
-- ARGV[2] ended starts, one per line: id TAB position [TAB 1 if its retry copy was produced]
-- ARGV[3] starts, one per line: id TAB key TAB position TAB ordered (1, 0, or 2: a retry copy
-- on a lane that no longer parks while keys it parked remain, decided as its key's head if it is
-- that, else as unordered; see gd_reap's drain) TAB attempt TAB
-- inherited (1: its partition's previous owner died with it in its claimed range, or 0) TAB
-- body (1: its encoded message is among ARGV[6...], in the order of the starts, or 0)
-- ARGV[4] the calling member process's instance id   ARGV[5] how long it is alive from now
-- (ms), or empty when it was renewed recently (gd_live)   ARGV[6...] the bodies of the starts
-- that carry one
-- An empty position is the id itself (a first delivery).
-- Returns the decisions as one string, one "<letter><starts>" per start, comma-separated:
-- p process, s suspect, c copy, x stale, w slow (the key is parked: ask gd_key_begin), b busy
-- (another live member process runs this very copy: ask again later), h held (the key is
-- parked and the start carried its body, which waits here behind the head as in gd_key_begin),
-- r head (the key is parked and this is its head, free to run: as gd_key_begin's process, so
-- its end goes to gd_end_many, which releases the followers).
-- The member sends a body with the starts of keys it saw parked, so most followers are held in
-- this batched call rather than in a gd_key_begin of their own; a head's copy due from its tier
-- needs none. What is left to gd_key_begin (slow) is rare: a key whose head is gone, a head that
-- follows a dead-lettered one or is not free to run, a follower sent without its body.
-- The marks of the ends and of the starts are read in one HMGET; an end is applied before the
-- starts are decided, so a start of a message that just ended sees no mark.
local CODES = {process = 'p', suspect = 's', copy = 'c', busy = 'b', held = 'h', head = 'r'}

-- The start of `id` (read at `pos`, attempt `attempt`) on its parked key, decided here when it
-- is the key's head: 'head' (free to run, its mark written, naming the member process `me`) and
-- its starts; 'busy' if another live member process runs this very copy (a head's start waits
-- long behind a suspect run alone: its copy, delivered again elsewhere meanwhile, must not run
-- beside or after it); else nil, and nothing written (gd_key_begin decides it).
-- Also 'busy' for a copy read elsewhere while the mark names a start that another live member
-- process made, and whose route to a retry tier was not recorded (gd_route got no answer):
-- that start may still run, or it ended and its end (ending the mark) has not reached Redis
-- yet. Either way its end comes: taken for a duplicate, this copy (perhaps the one that start
-- produced) would be dropped, its offset committed, and the key's followers never released.
-- k: run, gone, z, h, f, live.
local function as_head(k, id, pos, attempt, me, now)
  local head, seq = live_head(k.gone, k.z, k.f)
  if head ~= id then return nil end
  if seq <= tonumber(redis.call('HGET', k.h, 'dead_until') or '0') then return nil end
  local was = redis.call('HGET', k.run, id)
  local decision, starts, mark = decide(was, pos, attempt, false, me, k.live, now)
  if decision == 'busy' then return 'busy', starts end
  if decision == 'copy' and was then
    local ran, at, _, inst = parse(was)
    if ran > 0 and at ~= pos and inst ~= '' and inst ~= me and live(k.live, inst, now) then
      return 'busy', ran
    end
  end
  if decision ~= 'process' then return nil end
  redis.call('HSET', k.run, id, mark)
  return 'head', starts
end
local function begin_many(keys, args)
  local now, me = now_ms(), args[4]
  local hold_ms = args[1]
  local tag = tag_of(keys[1])
  if args[5] and args[5] ~= '' then
    redis.call('HSET', keys[5], me, now + tonumber(args[5]))
    redis.call('PEXPIRE', keys[5], 2 * tonumber(args[5]))
  end
  local ended, positions_ended, routed_ended = end_lines(args[2])
  local ids, names, positions, ordered, attempts, inherited, bodies = {}, {}, {}, {}, {}, {}, {}
  local pattern = '([^\t\n]+)\t([^\t\n]*)\t([^\t\n]*)\t([012])\t(%d+)\t([01])\t([01])'
  local draining = {}
  local body = 5
  for id, key, pos, o, attempt, inh, b in string.gmatch(args[3], pattern) do
    ids[#ids + 1] = id
    names[#names + 1] = key
    positions[#positions + 1] = pos == '' and id or pos
    ordered[#ordered + 1] = o == '1'
    draining[#ids] = o == '2'
    attempts[#attempts + 1] = attempt
    inherited[#inherited + 1] = inh == '1'
    if b == '1' then
      body = body + 1
      bodies[#ids] = args[body]
    end
  end
  local all = {}
  for _, id in ipairs(ended) do all[#all + 1] = id end
  for _, id in ipairs(ids) do all[#all + 1] = id end
  if #all == 0 then return '' end
  local read = bulk('HMGET', keys[1], all)
  local ended_marks, marks = {}, {}
  for i = 1, #ended do ended_marks[i] = read[i] end
  local ended_now = end_marks(keys[1], keys[4], ended, positions_ended, routed_ended, ended_marks)
  for i, id in ipairs(ids) do
    local mark = read[#ended + i]
    if ended_now[id] ~= nil then mark = ended_now[id] end
    marks[i] = mark
  end
  local out = {}
  if #ids > 0 then
    -- Only ordered starts can find their key parked or their id gone (both come from parking):
    -- a lane without ordered retries reads neither, unless it drains what it parked before.
    local any_ordered = false
    for i = 1, #ids do any_ordered = any_ordered or ordered[i] or draining[i] end
    local gone, parked = {}, {}
    if any_ordered then
      gone = bulk('ZMSCORE', keys[2], ids)
      parked = bulk('HMGET', keys[3], names)
    end
    local writes, seen = {}, {}
    for i, id in ipairs(ids) do
      local held, held_starts = nil, 0
      if (ordered[i] or draining[i]) and parked[i] and not gone[i] then
        local key = names[i]
        local k = of_key({run = keys[1], gone = keys[2], parked = keys[3], live = keys[5],
                          rel = tag .. ':rel'}, tag, key)
        if ordered[i] and below_parking(k, id, positions[i]) then
          gone[i] = true  -- read again from below where its key was parked: stale
        elseif bodies[i] and ordered[i] then
          held = hold(k, hold_ms, id, key, bodies[i])
        end
        if not held and not gone[i] then
          held, held_starts = as_head(k, id, positions[i], attempts[i], me, now)
        end
      end
      if gone[i] and ordered[i] then
        out[i] = 'x0'
      elseif held then
        out[i] = CODES[held] .. held_starts
      elseif ordered[i] and parked[i] then
        out[i] = 'w0'
      elseif seen[id] then
        out[i] = 'c0'  -- two copies in one batch: the first one runs
      else
        seen[id] = true
        local decision, starts, mark = decide(marks[i], positions[i], attempts[i], false, me,
                                              keys[5], now)
        if decision == 'process' and marks[i] then
          -- A retry copy took its failed start's mark over: a lone count of that start ends
          -- here, as the mark's starts go back to one and its end will not see it.
          redis.call('HDEL', keys[4], id)
        end
        if decision == 'process' and not marks[i] and inherited[i] then
          -- Its previous owner died with it claimed (runtime/claims.py): it may have been
          -- running, so its mark says two starts. It runs beside others, as that owner ran
          -- it if at all: nothing tells it from its neighbours yet, so nothing counts towards
          -- poison_after (gd_solo counts the lone starts once it is a suspect).
          starts, mark = 2, '2|' .. positions[i] .. '||' .. me
        end
        if mark then
          writes[#writes + 1] = id
          writes[#writes + 1] = mark
        end
        out[i] = CODES[decision] .. starts
      end
    end
    if #writes > 0 then bulk('HSET', keys[1], writes) end
  end
  return table.concat(out, ',')
end

-- gd_key_begin: decide a start of a message whose key is parked.
-- KEYS[1] T:run   KEYS[2] T:gone   KEYS[3] T:parked   KEYS[4] T:z:K   KEYS[5] T:h:K   KEYS[6] T:f:K
-- KEYS[7] T:live
-- ARGV[1] hold_ms (T:run, the key's state, T:parked and T:rel)   ARGV[2] id   ARGV[3] key
-- ARGV[4] position   ARGV[5] attempt   ARGV[6] the encoded message (stored if it is held)
-- ARGV[7] the calling member process's instance id
-- Returns {decision, starts}; busy as in gd_begin. A key found with no live head is unparked
-- and its state deleted here.
local function begin_parked(keys, args)
  local hold_ms = args[1]
  local id, key, pos, attempt, blob = args[2], args[3], args[4], args[5], args[6]
  local me, now = args[7], now_ms()
  if redis.call('ZSCORE', keys[2], id) then return {'stale', 0} end
  local k = {gone = keys[2], parked = keys[3], z = keys[4], h = keys[5], f = keys[6],
             rel = tag_of(keys[1]) .. ':rel'}
  if below_parking(k, id, pos) then return {'stale', 0} end
  local held = hold(k, hold_ms, id, key, blob)
  if held then return {held, 0} end
  local head, head_seq = live_head(keys[2], keys[4], keys[6])
  if not head then
    redis.call('DEL', keys[4], keys[5], keys[6])
    redis.call('HDEL', keys[3], key)
    local decision, starts = mark_start(keys[1], id, pos, attempt, false, me, keys[7], now)
    redis.call('PEXPIRE', keys[1], hold_ms)
    return {decision, starts}
  end
  local dead_until = tonumber(redis.call('HGET', keys[5], 'dead_until') or '0')
  if head_seq <= dead_until then return {'sequenced', 0} end
  local decision, starts = mark_start(keys[1], id, pos, attempt, false, me, keys[7], now)
  redis.call('PEXPIRE', keys[1], hold_ms)
  return {decision, starts}
end

-- gd_route: a started message is about to be produced to a retry tier (a failure, or a deferral).
-- KEYS[1] T:run   KEYS[2] T:gone   KEYS[3] T:parked   KEYS[4] T:z:K   KEYS[5] T:h:K
-- ARGV[1] hold_ms (T:run, the key's state, T:parked and T:rel)   ARGV[2] id   ARGV[3] key
-- ARGV[4] position   ARGV[5] the copy's attempt   ARGV[6] "1" to park the key (an ordered lane)
-- ARGV[7] (may be absent or empty) where the key is parked from: "topic:partition:offset" of a
-- main topic, the lowest offset of the key the calling member has not finished there (the
-- start itself, read there, unless an earlier one was left unfinished); kept in T:h:K (below)
-- if this call parks the key, which had nothing parked
-- Parks the key first, so the copy can never find its key unparked, and lets that copy (by its
-- attempt) take the start mark over even if this start has not ended yet.
local function route(keys, args)
  local hold_ms = args[1]
  local id, key, pos, attempt = args[2], args[3], args[4], args[5]
  local mark = redis.call('HGET', keys[1], id)
  local starts, at = 1, pos
  if mark then starts, at = parse(mark) end
  if at == pos then
    redis.call('HSET', keys[1], id, math.max(starts, 1) .. '|' .. pos .. '|' .. attempt)
    redis.call('PEXPIRE', keys[1], hold_ms)
  end
  if args[6] == '1' and not redis.call('ZSCORE', keys[2], id) then
    if not redis.call('ZSCORE', keys[4], id) then
      if redis.call('EXISTS', keys[4]) == 0 then  -- the key is parked from here
        if args[7] and args[7] ~= '' then
          redis.call('HSET', keys[5], 'below', args[7])
        else
          redis.call('HDEL', keys[5], 'below')
        end
      end
      redis.call('ZADD', keys[4], redis.call('HINCRBY', keys[5], 'seq', 1), id)
    end
    redis.call('HSET', keys[3], key, 1)
    local tag = tag_of(keys[1])
    keep_key(hold_ms, {z = keys[4], h = keys[5], f = tag .. ':f:' .. key, parked = keys[3],
                       rel = tag .. ':rel'})
  end
  return 1
end

-- Hand the key's next held followers to the caller (at most `n`), or unpark the key when none
-- is left. The first is the live head, decided as a released start (process, or suspect if an
-- earlier start of it never ended; sequenced behind a dead-lettered head); only after a first
-- that is a plain process come more: the held followers right behind it whose start is fresh
-- (no mark), each marked as started here. A suspect or a sequenced follower is always released
-- alone, so its end is recorded before anything after it runs. k: run, gone, parked, z, h, f,
-- rel (as in finish_one); `hold_ms` the expiry of T:run, the key's state, T:parked and T:rel.
-- Returns a flat list, three per follower: decision, id, message.
local function release_next(k, now, hold_ms, key, lease, n, me)
  local head, seq = live_head(k.gone, k.z, k.f)
  if not head then
    redis.call('DEL', k.z, k.h, k.f)
    redis.call('HDEL', k.parked, key)
    redis.call('ZREM', k.rel, key)
    return {}
  end
  local blob = redis.call('HGET', k.f, head)
  if not blob then  -- the head is waiting in a retry tier: it runs from there
    redis.call('HDEL', k.h, 'rel', 'by')
    redis.call('ZREM', k.rel, key)
    return {}
  end
  redis.call('HSET', k.h, 'rel', head, 'by', me)
  redis.call('ZADD', k.rel, now + lease, key)
  keep_key(hold_ms, k)
  if seq <= tonumber(redis.call('HGET', k.h, 'dead_until') or '0') then
    return {'sequenced', head, blob}
  end
  local decision = mark_start(k.run, head, 'rel', '', true)
  local out = {decision, head, blob}
  local more = {}
  if decision == 'process' and n > 1 then more = redis.call('ZRANGE', k.z, 1, n - 1) end
  if #more > 0 then
    local bodies = redis.call('HMGET', k.f, unpack(more))
    local marks = redis.call('HMGET', k.run, unpack(more))
    local gone = redis.call('ZMSCORE', k.gone, unpack(more))
    local fresh = {}
    for i, id in ipairs(more) do
      if not bodies[i] or marks[i] or gone[i] then break end
      out[#out + 1] = 'process'
      out[#out + 1] = id
      out[#out + 1] = bodies[i]
      fresh[#fresh + 1] = id
      fresh[#fresh + 1] = '1|rel'
    end
    if #fresh > 0 then redis.call('HSET', k.run, unpack(fresh)) end
  end
  redis.call('PEXPIRE', k.run, hold_ms)
  return out
end

-- Record how message `id` of parked key `key` ended (or how a message came to park its key).
-- k: run, alone, gone, parked, z, h, f, rel. `follow` is "follow" if followers of a
-- dead-lettered head follow it into the DLQ; `pos` the position of the start that ended (its
-- mark is left alone if a copy took it over; "rel" for a released follower); `hold_ms` the
-- expiry of T:run, T:gone, the key's state, T:parked and T:rel; `lease` the
-- release lease (ms); `n` how many followers to release after it (0: none, the caller has them
-- already). `outcome`:
--   done    handled (or skipped, expired): it leaves the parked set, the next followers are
--           released
--   parked  sent to a retry tier: it stays (or becomes) the key's head; its body is in the tier,
--           and its mark is left for that copy (ended_mark)
--   dead    dead-lettered: it leaves; with "follow", those parked behind it are sequenced
--   back    released but not run (the follower before it failed): its start mark is undone,
--           and it waits where it was, held
-- A done or dead end of a copy another member process took over (its mark names that process,
-- or the message left the parked set already) is stale and changes nothing; `me` is the
-- calling member process.
-- Returns the followers released to the caller: a flat list, three per follower.
local function finish_one(k, now, hold_ms, lease, id, key, outcome, follow, pos, n, me)
  -- A released follower's end from a member whose release another took over (gd_reap, while
  -- it was stalled): what it ran is recorded, but the release is the other member's now.
  local taken = false
  if pos == 'rel' then
    local by = redis.call('HGET', k.h, 'by')
    taken = by and by ~= me
  end
  if taken and outcome == 'back' then return {} end  -- the marks are the new holder's
  local mark = redis.call('HGET', k.run, id)
  if pos ~= 'rel' and (outcome == 'done' or outcome == 'dead') then
    -- The end of a copy another member took over while this one was stalled past its
    -- liveness (it ran the copy as a suspect, and is running it or ended it already): that
    -- member's end records the message and releases its followers; this one changes nothing.
    if mark then
      local starts, at, _, inst = parse(mark)
      if starts > 0 and at == pos and inst ~= '' and inst ~= me then return {} end
    elseif redis.call('ZSCORE', k.gone, id) then
      return {}
    end
  end
  if outcome == 'back' then
    if mark then
      local starts, at = parse(mark)
      if at == pos and starts == 1 then redis.call('HDEL', k.run, id) end
    end
    return {}
  end
  if mark then
    local starts, at, route = parse(mark)
    if starts == 0 then  -- an ended start's, for its retry copy: gone once the message leaves
      if outcome ~= 'parked' then redis.call('HDEL', k.run, id) end
    elseif at == pos then
      local left = ended_mark(route, at, outcome == 'parked')
      if left then redis.call('HSET', k.run, id, left) else redis.call('HDEL', k.run, id) end
      redis.call('HDEL', k.alone, id)
    end
  end
  redis.call('HDEL', k.f, id)  -- a released follower's body is handled, routed or in a tier now
  if outcome == 'parked' then
    if not redis.call('ZSCORE', k.z, id) and not redis.call('ZSCORE', k.gone, id) then
      redis.call('ZADD', k.z, redis.call('HINCRBY', k.h, 'seq', 1), id)
    end
    if not taken and (pos == 'rel' or redis.call('HGET', k.h, 'rel') == id) then
      redis.call('HDEL', k.h, 'rel', 'by')  -- its release is over
      redis.call('ZREM', k.rel, key)
    end
    if redis.call('EXISTS', k.z) == 1 then
      redis.call('HSET', k.parked, key, 1)
      keep_key(hold_ms, k)
    end
    return {}
  end
  local left = redis.call('ZREM', k.z, id) == 1
  if left then
    redis.call('ZADD', k.gone, lane_now(k.gone, now), id)
    redis.call('PEXPIRE', k.gone, hold_ms)
  end
  if left and outcome == 'dead' and follow == 'follow' then
    -- Only a parked message takes those behind it along: a dead end of one that never was
    -- (sent again once Redis answered, after the key was parked anew) sequences nobody.
    local last = redis.call('ZRANGE', k.z, -1, -1, 'WITHSCORES')
    if last[2] then redis.call('HSET', k.h, 'dead_until', last[2]) end
  end
  if n == 0 or taken then return {} end
  if pos ~= 'rel' and redis.call('HEXISTS', k.h, 'rel') == 1 then
    -- Not the end of the key's head (a head's copy runs only while no release is in
    -- progress): an end sent again once Redis answered, after the key was parked anew, or
    -- the end of a message parked behind the followers, run while Redis did not answer. The
    -- release in progress stays with the member that holds it.
    return {}
  end
  return release_next(k, now, hold_ms, key, lease, n, me)
end

-- gd_end_many: record how messages of parked keys ended (finish_one), several in one call, in
-- order.
-- KEYS[1] T:run   KEYS[2] T:alone   KEYS[3] T:gone   KEYS[4] T:parked   KEYS[5] T:rel
-- ARGV[1] hold_ms (T:run, T:gone, the keys' state, T:parked, T:rel)   ARGV[2] lease_ms
-- ARGV[3] the tag T   ARGV[4] the calling member process,
-- then six per end: id, key, outcome (done | parked | dead | back), "follow"
-- or "", the position of the start that ended, how many followers to release after it (0:
-- none).
-- Returns one list per end: the followers released after it, three entries each (decision,
-- id, message), none if it released none.
local function finish_many(keys, args)
  local now, hold_ms = now_ms(), args[1]
  local lease, tag = tonumber(args[2]), args[3]
  local out = {}
  for i = 5, #args, 6 do
    local key = args[i + 1]
    local k = of_key({run = keys[1], alone = keys[2], gone = keys[3], parked = keys[4],
                      rel = keys[5]}, tag, key)
    out[#out + 1] = finish_one(k, now, hold_ms, lease, args[i], key, args[i + 2],
                               args[i + 3], args[i + 4], tonumber(args[i + 5]), args[4])
  end
  return out
end

-- gd_solo: count a suspect's lone start, once nothing else runs beside it in its member.
-- KEYS[1] T:run   KEYS[2] T:alone   KEYS[3] T:gone
-- ARGV[1] id   ARGV[2] position   ARGV[3] hold_ms (T:alone)   ARGV[4] poison_after
-- Its first interrupted start may have been a neighbour's fault; every lone start after that
-- was interrupted by itself. Returns {verdict, lone starts}: stale if another copy finished it
-- or took it over meanwhile, poison once the interruptions (the first plus the lone ones) reach
-- poison_after, else process.
local function solo(keys, args)
  local id, pos = args[1], args[2]
  if redis.call('ZSCORE', keys[3], id) then return {'stale', 0} end
  local mark = redis.call('HGET', keys[1], id)
  if not mark then return {'stale', 0} end
  local starts, at = parse(mark)
  if at ~= pos or starts == 0 then return {'stale', 0} end
  local alone = redis.call('HINCRBY', keys[2], id, 1)
  redis.call('PEXPIRE', keys[2], args[3])
  if alone >= tonumber(args[4]) then return {'poison', alone} end
  return {'process', alone}
end

-- Appends a follower release_next released (key, decision, id, message) to out; nothing when
-- it released none.
local function add_released(out, key, released)
  if released[1] then
    out[#out + 1] = key
    out[#out + 1] = released[1]
    out[#out + 1] = released[2]
    out[#out + 1] = released[3]
  end
end

-- A lane that no longer parks (made unordered, or left without retry tiers) has no head of its
-- own to release what it parked before: its members' reap releases each parked key with no
-- release in progress (at most `limit`) to the caller. A held follower at the head is released as
-- usual (release_next). A head waiting in a retry tier is let go (as if it had ended: the key's
-- followers no longer wait for it, and its copy, if one comes back, runs on its own) once no
-- copy of it can be expected: `grace_ms` after the key's state last changed (0 on a lane left
-- without tiers, whose copies no member reads), and not while a copy of it runs. A head's copy
-- that comes back within the grace runs as the head (gd_begin's ordered 2) and its end releases
-- the followers, in order.
-- Returns a flat list as gd_reap's.
local function drain(tag, parked, rel, now, hold_ms, lease, grace_ms, limit, me)
  local out = {}
  local fields = redis.call('HSCAN', parked, 0, 'COUNT', limit)[2]
  for i = 1, #fields, 2 do
    if #out >= 4 * limit then break end
    local key = fields[i]
    if not redis.call('ZSCORE', rel, key) then
      local k = of_key({run = tag .. ':run', gone = tag .. ':gone', parked = parked, rel = rel},
                       tag, key)
      local head = live_head(k.gone, k.z, k.f)
      local due = true
      if head and redis.call('HEXISTS', k.f, head) == 0 then  -- waiting in a retry tier
        -- Not while a copy of it runs as the head (its end releases the key), and not before
        -- the grace: a copy of it may still come back and run first.
        local mark = redis.call('HGET', k.run, head)
        -- Its state was kept for the hold of the declaration that wrote it: under a new one
        -- with a shorter retry path, hold_ms - ttl also waits out the difference, for as long
        -- as members of the old declaration may still run the head's copy from its old tier.
        local ttl = redis.call('PTTL', k.z)
        due = not (mark and parse(mark) > 0) and (ttl < 0 or tonumber(hold_ms) - ttl >= grace_ms)
        if due then redis.call('ZREM', k.z, head) end
      end
      if due then
        add_released(out, key, release_next(k, now, hold_ms, key, lease, 1, me))
      end
    end
  end
  return out
end

-- gd_reap: take over releases whose member stopped renewing their lease (it died mid-release).
-- KEYS[1] T:rel   ARGV[1] ttl_ms (how long T:gone keeps an entry, by the lane's clock)
-- ARGV[2] hold_ms (T:run, T:alone, T:gone, T:parked, T:rel and the state of the keys taken
-- over)
-- ARGV[3] lease_ms (also the longest gap between two reaps the lane's clock counts)
-- ARGV[4] the tag T   ARGV[5] at most this many keys   ARGV[6] the calling member process (the
-- releases' holder)   ARGV[7] empty while the lane parks (ordered with retry tiers); else the
-- drain's grace (ms): the lane no longer parks, so nothing else releases the keys it parked
-- (drain)
-- Returns the number of keys parked now, then a flat list: key, decision, id, message for each
-- follower taken over or drained.
local function reap(keys, args)
  local now, ttl, hold_ms = now_ms(), args[1], args[2]
  local lease, tag = tonumber(args[3]), args[4]
  -- The batched starts (gd_begin) leave the lane's expiry and trimming to this periodic call.
  -- A gap since the last reap longer than a lease is time every member was down: the lane's
  -- clock skips it, so a copy read again once they are back still finds its message gone.
  local gone = tag .. ':gone'
  local at, off = unpack(redis.call('ZMSCORE', gone, CLOCK_AT, CLOCK_OFF))
  off = tonumber(off or '0')
  if at and now - tonumber(at) > lease then off = off + now - tonumber(at) - lease end
  redis.call('ZREMRANGEBYSCORE', gone, '-inf', now - off - tonumber(ttl))
  redis.call('ZADD', gone, now, CLOCK_AT, off, CLOCK_OFF)
  expire(hold_ms, tag .. ':run', tag .. ':alone', gone, tag .. ':parked', keys[1])
  local due = redis.call('ZRANGEBYSCORE', keys[1], '-inf', now, 'LIMIT', 0, tonumber(args[5]))
  local out = {}
  for _, key in ipairs(due) do
    local k = of_key({run = tag .. ':run', gone = tag .. ':gone', parked = tag .. ':parked',
                      rel = keys[1]}, tag, key)
    add_released(out, key, release_next(k, now, hold_ms, key, lease, 1, args[6]))
  end
  local parked = tag .. ':parked'
  if args[7] and args[7] ~= '' then
    local drained = drain(tag, parked, keys[1], now, hold_ms, lease, tonumber(args[7]),
                          tonumber(args[5]), args[6])
    for _, v in ipairs(drained) do out[#out + 1] = v end
  end
  table.insert(out, 1, redis.call('HLEN', parked))
  return out
end

-- gd_renew: extend the leases of the releases this member runs.
-- KEYS[1] T:rel   ARGV[1] the lease ms (from now, Redis's clock), then the keys
local function renew(keys, args)
  local until_ms = now_ms() + tonumber(args[1])
  for i = 2, #args do redis.call('ZADD', keys[1], 'XX', until_ms, args[i]) end
  return #args - 1
end

-- gd_live: the calling member process is alive for ARGV[2] ms from now (Redis's clock); its
-- marks of a copy that another process reads meanwhile answer busy instead of suspect.
-- KEYS[1] T:live   ARGV[1] instance id   ARGV[2] live ms
-- Drops the entries of processes whose liveness ran out.
local function live_renew(keys, args)
  local now, live_ms = now_ms(), tonumber(args[2])
  redis.call('HSET', keys[1], args[1], now + live_ms)
  redis.call('PEXPIRE', keys[1], 2 * live_ms)  -- gone once nobody renews
  local flat = redis.call('HGETALL', keys[1])
  for i = 1, #flat, 2 do
    if tonumber(flat[i + 1]) <= now then redis.call('HDEL', keys[1], flat[i]) end
  end
  return 1
end

-- Claimed ranges. OWNER is the field naming the process a partition was assigned to last.
local OWNER = '@owner'

-- gd_take: the partitions were assigned to the calling process, which becomes their owner.
-- KEYS the claims hashes   ARGV[1] instance id   ARGV[2] expiry ms   then per key: lo, least hi
-- Claims lo..hi, hi the larger of least hi and the top of every other process's claim, in the
-- same step as it reads those claims: a process that took the partition earlier is seen here,
-- one that takes it later sees this claim. Returns per key {hi, {instance, "lo|hi", ...}}.
-- lo is the partition's committed position: a claim wholly below it covers only finished
-- work, so it is deleted here, not returned (a process that crashed never gives its claim up,
-- and a renewed hash never expires: a crash loop would grow it by one field a start).
local function take(keys, args)
  local me, ttl = args[1], args[2]
  local out = {}
  for i, key in ipairs(keys) do
    local lo, hi = tonumber(args[1 + 2 * i]), tonumber(args[2 + 2 * i])
    local others = {}
    local flat = redis.call('HGETALL', key)
    for j = 1, #flat, 2 do
      local who, claimed = flat[j], flat[j + 1]
      local top = tonumber(string.match(claimed, '^%-?%d+|(%-?%d+)$') or '')
      if who ~= OWNER and who ~= me and top and top < lo then
        redis.call('HDEL', key, who)
      elseif who ~= OWNER and who ~= me and top then
        if top > hi then hi = top end
        others[#others + 1] = who
        others[#others + 1] = claimed
      end
    end
    redis.call('HSET', key, OWNER, me, me, string.format('%d|%d', lo, hi))
    redis.call('PEXPIRE', key, ttl)
    out[i] = {hi, others}
  end
  return out
end

-- gd_claim: write the calling process's claims (grown or renewed), except on partitions
-- another process was assigned since this one's last gd_take: that process may be running the
-- offsets above what this one claimed then. On a partition nobody owns the writer becomes the
-- owner again.
-- KEYS the claims hashes   ARGV[1] instance id   ARGV[2] expiry ms   then per key: lo, hi
-- Returns per key 1 (written) or 0 (the partition is another process's now).
local function claim(keys, args)
  local me, ttl = args[1], args[2]
  local out = {}
  for i, key in ipairs(keys) do
    local owner = redis.call('HGET', key, OWNER)
    if owner and owner ~= me then
      out[i] = 0
    else
      -- Unowned (its owner gave it up, perhaps this process's own give-up racing its next
      -- assignment's gd_take): the writer holds the partition, so it is the owner again.
      redis.call('HSET', key, me, args[1 + 2 * i] .. '|' .. args[2 + 2 * i], OWNER, me)
      redis.call('PEXPIRE', key, ttl)
      out[i] = 1
    end
  end
  return out
end

-- gd_unclaim: the calling process gives its claims up (their work here has ended), and with
-- them its ownership of each partition it is still the owner of: the hash goes once empty.
-- KEYS the claims hashes   ARGV[1] instance id
local function unclaim(keys, args)
  for _, key in ipairs(keys) do
    redis.call('HDEL', key, args[1])
    if redis.call('HGET', key, OWNER) == args[1] then redis.call('HDEL', key, OWNER) end
  end
  return #keys
end

redis.register_function('gd_begin', begin_many)
redis.register_function('gd_unclaim', unclaim)
redis.register_function('gd_take', take)
redis.register_function('gd_claim', claim)
redis.register_function('gd_live', live_renew)
redis.register_function('gd_key_begin', begin_parked)
redis.register_function('gd_route', route)
redis.register_function('gd_end_many', finish_many)
redis.register_function('gd_solo', solo)
redis.register_function('gd_reap', reap)
redis.register_function('gd_renew', renew)
