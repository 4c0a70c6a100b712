#!lua name=pipeline_streams
-- The Redis Streams transport's server-side steps, loaded once per process with FUNCTION LOAD
-- REPLACE (pipeline/transport/redis_streams/functions.py). Time always comes from the Redis
-- server (TIME), so members on hosts with skewed clocks agree on lease expiry.

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- The offset above every id of stream `s` (its last-generated-id's milliseconds): the first
-- whose entry id (offset + 1)-0 XADD takes.
local function past_top(s)
  local info = redis.call('XINFO', 'STREAM', s)
  for i = 1, #info, 2 do
    if info[i] == 'last-generated-id' then
      return tonumber(string.match(info[i + 1], '^%d+'))
    end
  end
end

-- pl_produce: append a batch of messages to one partition, giving them consecutive offsets.
-- KEYS[1] stream {P:T:p}:s      KEYS[2] offset counter {P:T:p}:n
-- ARGV[1] max_len (approximate entries kept, XADD MAXLEN ~)   ARGV[2] n, the number of messages
-- then per message: the count of the field/value arguments that follow, then those fields:
--   k (key, absent for none), v (value), h.<name> (headers)
-- Returns {first offset, timestamp_ms}. The entry id of offset o is (o + 1)-0 (ids start at 1-0).
-- Another client may have appended an entry with a raw XADD whose id is at or above the next
-- one (an auto id is Redis's clock in ms): the batch then goes on past it, the counter moved
-- there, so the offsets in between stay unused and production does not stop.
local function produce(keys, args)
  local n = tonumber(args[2])
  local first = redis.call('INCRBY', keys[2], n) - n
  local ts = now_ms()
  local i = 3
  for m = 0, n - 1 do
    local nf = tonumber(args[i])
    local added = redis.pcall('XADD', keys[1], 'MAXLEN', '~', args[1],
                              string.format('%d-0', first + m + 1), 't', ts,
                              unpack(args, i + 1, i + nf))
    if type(added) == 'table' and added.err then
      if m > 0 or not string.find(added.err, 'equal or smaller', 1, true) then
        return redis.error_reply(added.err)
      end
      first = past_top(keys[1])
      redis.call('SET', keys[2], first + n)
      redis.call('XADD', keys[1], 'MAXLEN', '~', args[1], string.format('%d-0', first + 1),
                 't', ts, unpack(args, i + 1, i + nf))
    end
    i = i + nf + 1
  end
  return {first, ts}
end

-- pl_heartbeat: renew a member's lease, drop dead members and move partitions.
-- KEYS[1] members zset {P:g:G}:members     KEYS[2] owners hash {P:g:G}:owners
-- ARGV[1] member id   ARGV[2] lease_ms   ARGV[3..] every partition id "T:p" of the group, sorted
-- Live members (sorted by id) share the partitions round-robin. A member keeps renewing a
-- partition it owns even when the target assignment gives it to someone else, until it
-- releases it (pl_release) after draining: the hand-over is cooperative. A partition whose
-- owner's lease expired (a dead member) goes straight to its target.
-- Returns {owned partition ids, ids to release}.
local function heartbeat(keys, args)
  local me, lease = args[1], tonumber(args[2])
  local now = now_ms()
  redis.call('ZADD', keys[1], now + lease, me)
  redis.call('ZREMRANGEBYSCORE', keys[1], '-inf', now)
  local live = redis.call('ZRANGE', keys[1], 0, -1)
  table.sort(live)
  local owned, release = {}, {}
  for i = 3, #args do
    local pid = args[i]
    local target = live[((i - 3) % #live) + 1]
    local cur = redis.call('HGET', keys[2], pid)
    local owner, expiry = nil, 0
    if cur then
      local sep = string.find(cur, '|', 1, true)
      owner, expiry = string.sub(cur, 1, sep - 1), tonumber(string.sub(cur, sep + 1))
    end
    if owner == me and expiry >= now then
      redis.call('HSET', keys[2], pid, me .. '|' .. (now + lease))
      owned[#owned + 1] = pid
      if target ~= me then release[#release + 1] = pid end
    elseif target == me and (owner == nil or owner == me or expiry < now) then
      redis.call('HSET', keys[2], pid, me .. '|' .. (now + lease))
      owned[#owned + 1] = pid
    end
  end
  return {owned, release}
end

-- Whether the lease of partition `pid` in the owners hash names member `me` (expired or not:
-- only another member's claim replaces the name).
local function holds(owners, pid, me)
  local cur = redis.call('HGET', owners, pid)
  return cur and string.sub(cur, 1, #me + 1) == me .. '|'
end

-- pl_release: give partitions up (after draining them) or leave the group.
-- KEYS[1] members zset   KEYS[2] owners hash
-- ARGV[1] member id   ARGV[2] "1" to leave the group   ARGV[3..] partition ids to release
-- Only partitions this member still owns are released. Returns how many were.
local function release(keys, args)
  local me, n = args[1], 0
  if args[2] == '1' then redis.call('ZREM', keys[1], me) end
  for i = 3, #args do
    if holds(keys[2], args[i], me) then
      redis.call('HDEL', keys[2], args[i])
      n = n + 1
    end
  end
  return n
end

-- pl_commit: record the committed positions of the partitions the calling member still holds.
-- KEYS[1] owners hash   KEYS[2] positions hash {P:g:G}:pos
-- ARGV[1] member id   then per partition: partition id, position, metadata
-- A partition whose lease names another member (it took the partition over while this one
-- was stalled) keeps its position: a stale member must not move it back. Returns those ids.
local function commit(keys, args)
  local me = args[1]
  local refused = {}
  for i = 2, #args, 3 do
    local pid = args[i]
    if holds(keys[1], pid, me) then
      redis.call('HSET', keys[2], pid, args[i + 1], pid .. ':meta', args[i + 2])
    else
      refused[#refused + 1] = pid
    end
  end
  return refused
end

-- pl_forget_consumers: delete the consumers of a partition's group that hold nothing pending,
-- once the partition's owner has claimed every entry they had (former owners: a member that
-- died, left or restarted under a new name leaves one behind on each stream it read).
-- KEYS[1] stream {P:T:p}:s   ARGV[1] group   ARGV[2] the owner's member id (kept)
-- In one step, so a consumer seen with no pending entry cannot be given one before it goes:
-- nothing delivered leaves the pending list. Returns how many consumers were deleted.
local function forget_consumers(keys, args)
  local n = 0
  for _, consumer in ipairs(redis.call('XINFO', 'CONSUMERS', keys[1], args[1])) do
    local fields = {}
    for i = 1, #consumer, 2 do fields[consumer[i]] = consumer[i + 1] end
    if fields['name'] ~= args[2] and fields['pending'] == 0 then
      redis.call('XGROUP', 'DELCONSUMER', keys[1], args[1], fields['name'])
      n = n + 1
    end
  end
  return n
end

redis.register_function('pl_produce', produce)
redis.register_function('pl_commit', commit)
redis.register_function('pl_heartbeat', heartbeat)
redis.register_function('pl_release', release)
redis.register_function('pl_forget_consumers', forget_consumers)
