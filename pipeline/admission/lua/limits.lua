#!lua name=pipeline_limits
-- The per-org stats behind the fleet's dynamic limits, written and read for a batch of orgs in
-- one call (pipeline/admission/limits.py, LimitTracker). Loaded once per process with
-- FUNCTION LOAD REPLACE under its versioned name (pipeline/redis_functions.py).
--
--   {PREFIX:lim:ORG}:stats   hash   n:MINUTE submissions, c:MINUTE jobs finished,
--                                   d:MINUTE their durations summed (s); see keys.py
--
-- Each org's stats key is its own hash tag, so these calls serve a single Redis, where a call
-- may name keys of any slot; on a Redis Cluster LimitTracker pipelines the same commands.
-- Both functions do, per org, the commands the pipelined path sends, in its order, with the
-- arguments as the caller wrote them (no number is formatted here), so the stats and the
-- limits computed from them are the same either way; lim_record deletes only the stale fields
-- a hash holds, where the pipeline sends an HDEL of all of them.

-- The stale fields the hash at key holds deleted, the others not looked up: nearly all of them
-- went at an earlier write, and an HDEL of all thirty searched the hash for each, half of a
-- call's time (250 orgs: 2.6 ms, 2.1 now). The hash is left as that HDEL leaves it.
local function drop_stale(key, gone)
  local present = {}
  for _, field in ipairs(redis.call('HKEYS', key)) do
    if gone[field] then present[#present + 1] = field end
  end
  if #present > 0 then redis.call('HDEL', key, unpack(present)) end
end

-- lim_record: add one tick's counts to the stats of a batch of orgs.
-- KEYS[i]  the stats key of org i
-- ARGV[1] n field   ARGV[2] c field   ARGV[3] d field (of this minute)   ARGV[4] TTL (ms)
-- ARGV[5] G, the number of stale fields   ARGV[6 .. 5+G] the stale fields, deleted where present
-- then per org i, three arguments: submitted, jobs finished, their durations summed; a count
-- of "0" writes nothing (finished jobs write c and d together)
-- Returns the number of orgs written.
local function record(keys, args)
  local n_field, c_field, d_field, ttl_ms = args[1], args[2], args[3], args[4]
  local stale = tonumber(args[5])
  local gone = {}
  for i = 1, stale do gone[args[5 + i]] = true end
  local base = 5 + stale
  for i = 1, #keys do
    local key, at = keys[i], base + (i - 1) * 3
    if args[at + 1] ~= '0' then redis.call('HINCRBY', key, n_field, args[at + 1]) end
    if args[at + 2] ~= '0' then
      redis.call('HINCRBY', key, c_field, args[at + 2])
      redis.call('HINCRBYFLOAT', key, d_field, args[at + 3])
    end
    if stale > 0 then drop_stale(key, gone) end
    redis.call('PEXPIRE', key, ttl_ms)
  end
  return #keys
end

-- lim_read: the stats of a batch of orgs.
-- KEYS[i]  the stats key of org i
-- Returns one array per key: its fields and values as HGETALL gives them (empty: no stats).
local function read(keys, args)
  local out = {}
  for i = 1, #keys do out[i] = redis.call('HGETALL', keys[i]) end
  return out
end

redis.register_function('lim_record', record)
redis.register_function{function_name = 'lim_read', callback = read, flags = {'no-writes'}}
