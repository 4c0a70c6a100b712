#!lua name=pipeline_retry
-- Per-key parking (ordered retries) and poison detection for the consumer runtime, loaded once per
-- process with FUNCTION LOAD REPLACE (pipeline/retry/parking.py). All keys of one (lane, key)
-- share the hash tag {P:park:LANE:KEY}, so each call stays in one Redis Cluster slot.
--
--   {..}:z     zset   parked message id -> sequence; the lowest sequence is the key's head
--   {..}:h     hash   seq (last sequence given), dead_until (followers up to this sequence
--                     follow a dead-lettered head into the DLQ)
--   {..}:r:ID  string how many times message ID started processing without finishing
--   {..}:a:ID  string how many of those starts ran alone (a suspect's lone runs: poison)
--   {..}:gone  set    ids that left the parked set (handled or dead-lettered): a copy of one
--                     that shows up again (a redelivery after a crash) is stale and is dropped
-- Every key expires (ARGV ttl_ms), so a key whose messages vanish frees itself.

-- pl_begin: count a start and decide what to do with a message before its handler runs.
-- KEYS[1] zset   KEYS[2] hash   KEYS[3] run counter of this message
-- KEYS[4] gone set
-- ARGV[1] message id   ARGV[2] ttl_ms   ARGV[3] "1" if the lane is ordered
-- Returns {decision, starts}: decision is
--   stale      this message already left the parked set: a duplicate copy, do not run it
--   process    run the handler
--   suspect    an earlier start never finished: run it alone, after pl_solo
--   divert     the key has parked messages ahead of this one: send it behind them, do not run
--   sequenced  this message follows a dead-lettered head: dead-letter it without running
local function begin(keys, args)
  local id, ttl = args[1], tonumber(args[2])
  if args[3] == '1' and redis.call('SISMEMBER', keys[4], id) == 1 then
    return {'stale', 0}
  end
  if args[3] == '1' and redis.call('EXISTS', keys[1]) == 1 then
    -- A head that already finished (a duplicate copy re-parked it) must not block its key.
    local head = redis.call('ZRANGE', keys[1], 0, 0)[1]
    while head and redis.call('SISMEMBER', keys[4], head) == 1 do
      redis.call('ZREM', keys[1], head)
      head = redis.call('ZRANGE', keys[1], 0, 0)[1]
    end
    local rank = redis.call('ZRANK', keys[1], id)
    if not head then
      redis.call('DEL', keys[1], keys[2])  -- nothing left parked: run normally
    elseif not rank then
      local seq = redis.call('HINCRBY', keys[2], 'seq', 1)
      redis.call('ZADD', keys[1], seq, id)
      redis.call('PEXPIRE', keys[1], ttl)
      redis.call('PEXPIRE', keys[2], ttl)
      return {'divert', 0}
    elseif rank > 0 then
      return {'divert', 0}
    else
      local seq = tonumber(redis.call('ZSCORE', keys[1], id))
      local dead_until = tonumber(redis.call('HGET', keys[2], 'dead_until') or '0')
      if seq <= dead_until then
        return {'sequenced', 0}
      end
    end
  end
  local starts = redis.call('INCR', keys[3])
  redis.call('PEXPIRE', keys[3], ttl)
  if starts > 1 then
    return {'suspect', starts}
  end
  return {'process', starts}
end

-- pl_solo: count a suspect's lone start, once nothing else runs beside it in its member.
-- KEYS[1] lone-start counter of this message   ARGV[1] ttl_ms   ARGV[2] poison_after
-- Its first interrupted start may have been a neighbour's fault; every lone start after that
-- was interrupted by itself. Returns {decision, lone starts}: poison once the interruptions
-- (the first plus the lone ones) reach poison_after, else process.
local function solo(keys, args)
  local alone = redis.call('INCR', keys[1])
  redis.call('PEXPIRE', keys[1], tonumber(args[1]))
  if alone >= tonumber(args[2]) then
    return {'poison', alone}
  end
  return {'process', alone}
end

-- pl_end: record how a started (or sequenced) message ended.
-- KEYS[1] zset   KEYS[2] hash   KEYS[3] run counter of this message   KEYS[4] gone set
-- KEYS[5] lone-start counter of this message
-- ARGV[1] message id   ARGV[2] ttl_ms   ARGV[3] outcome: done | parked | dead
-- ARGV[4] "follow" if followers of a dead-lettered head follow it into the DLQ
--   done    handled (or skipped, expired): it leaves the parked set
--   parked  sent to a retry tier: it stays (or becomes) the key's parked head
--   dead    dead-lettered: it leaves; with "follow", those parked behind it will follow
-- Returns the number of messages still parked for the key.
local function finish(keys, args)
  local id, ttl, outcome = args[1], tonumber(args[2]), args[3]
  redis.call('DEL', keys[3], keys[5])
  if outcome == 'parked' then
    -- A duplicate copy that failed after another copy finished stays finished.
    if not redis.call('ZSCORE', keys[1], id) and redis.call('SISMEMBER', keys[4], id) == 0 then
      local seq = redis.call('HINCRBY', keys[2], 'seq', 1)
      redis.call('ZADD', keys[1], seq, id)
    end
    redis.call('PEXPIRE', keys[1], ttl)
    redis.call('PEXPIRE', keys[2], ttl)
  else
    if redis.call('ZREM', keys[1], id) == 1 then
      redis.call('SADD', keys[4], id)
      redis.call('PEXPIRE', keys[4], ttl)
    end
    if outcome == 'dead' and args[4] == 'follow' then
      local last = redis.call('ZRANGE', keys[1], -1, -1, 'WITHSCORES')
      if last[2] then redis.call('HSET', keys[2], 'dead_until', last[2]) end
    end
  end
  local left = redis.call('ZCARD', keys[1])
  if left == 0 then redis.call('DEL', keys[1], keys[2]) end
  return left
end

redis.register_function('pl_begin', begin)
redis.register_function('pl_end', finish)
redis.register_function('pl_solo', solo)
