#!lua name=pipeline_once
-- The idempotency guard's record of side effects (pipeline/runtime/idempotency.py).
-- A record {P:once:LANE}:ID:NAME holds "run:<token>" while a holder runs the side effect (with
-- a lease) and "done" once it succeeded (kept ttl_ms: the longest the lane's topics keep a copy
-- of the event, its dead letters' retention, plus its retry path; each delivery that finds it
-- done keeps it ttl_ms again, so a dead letter redriven, failed and redriven again is covered).

-- pl_once_claim: take the right to run a side effect.
-- KEYS[1] the record   ARGV[1] token   ARGV[2] lease_ms   ARGV[3] ttl_ms of "done" (optional)
-- Returns "claimed", "done" (it already ran) or "busy" (another holder runs it now).
local function claim(keys, args)
  local cur = redis.call('GET', keys[1])
  if cur == 'done' then
    if args[3] then redis.call('PEXPIRE', keys[1], args[3]) end
    return 'done'
  end
  if cur then return 'busy' end
  redis.call('SET', keys[1], 'run:' .. args[1], 'PX', args[2])
  return 'claimed'
end

-- pl_once_settle: record the end of a claimed run, only if this holder still owns the claim.
-- KEYS[1] the record   ARGV[1] token   ARGV[2] "done" or "abort"   ARGV[3] ttl_ms of "done"
-- Returns 1 if recorded, 0 if the claim had expired and passed to someone else.
local function settle(keys, args)
  if redis.call('GET', keys[1]) ~= 'run:' .. args[1] then return 0 end
  if args[2] == 'done' then
    redis.call('SET', keys[1], 'done', 'PX', args[3])
  else
    redis.call('DEL', keys[1])
  end
  return 1
end

-- pl_once_renew: extend a claim while its holder still runs the side effect.
-- KEYS[1] the record   ARGV[1] token   ARGV[2] lease_ms
-- Returns 1 if renewed, 0 if the claim is no longer this holder's.
local function renew(keys, args)
  if redis.call('GET', keys[1]) ~= 'run:' .. args[1] then return 0 end
  redis.call('PEXPIRE', keys[1], args[2])
  return 1
end

redis.register_function('pl_once_claim', claim)
redis.register_function('pl_once_renew', renew)
redis.register_function('pl_once_settle', settle)
