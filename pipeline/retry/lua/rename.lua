#!lua name=pipeline_guard_rename
-- Moving a parked key's state to the name this release gives it (pipeline/retry/rename_long_keys.py).
-- A release before the key bound named the state of a parked message key K by K's url-safe
-- base64 whatever its size; this one names a key over 768 bytes by `#sha256:<hex>` of K
-- (pipeline/retry/keys.py encode_key). The layout is the same (lua/guard.lua): T:z:K, T:h:K,
-- T:f:K, the field K of T:parked and the member K of T:rel, T = {P:guard:LANE}; every name
-- shares the lane's hash tag, so a call stays in one Redis Cluster slot.

-- gd_rename: move the state of parked keys from their earlier names to their current ones.
-- KEYS[1] T:parked   KEYS[2] T:rel   ARGV[1] the tag T, then pairs: earlier name, current name
-- Returns one code per pair:
--   1  moved: RENAME of each of T:z|h|f that exists (their expiry goes with them), the
--      T:parked field and the T:rel entry (its lease as it was) under the current name. A key
--      with no release in progress whose head waits in a retry tier (the usual state) needs
--      none: its head's copy releases its followers. One whose head is a held follower, or
--      finished already (under another name meanwhile), or that has no state left, is entered
--      in T:rel as due now (Redis's clock), so the lane's next gd_reap releases its next
--      follower or unparks it. (Entered at 0, every moved key read as a release 56 years past
--      its lease, pipeline_held_release_overdue_seconds, and reaps took those first.)
--   0  nothing to move: the earlier name is no longer parked (another member moved it, or it
--      was released)
--   2  both names are parked (a member of this release parked the key again meanwhile): both
--      are left as they are

-- Whether a moved key needs a release to go on: its head (the lowest of T:z:K) is a held
-- follower (its body in T:f:K) or finished (in T:gone), or the key has no head left.
local function release_due(tag, key)
  local head = redis.call('ZRANGE', tag .. ':z:' .. key, 0, 0)[1]
  if not head then return true end
  return redis.call('HEXISTS', tag .. ':f:' .. key, head) == 1
      or redis.call('ZSCORE', tag .. ':gone', head) ~= false
end

local function rename(keys, args)
  local tag, out, entered = args[1], {}, false
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local kinds = {':z:', ':h:', ':f:'}
  for i = 2, #args - 1, 2 do
    local old, new = args[i], args[i + 1]
    local code = 1
    if redis.call('HEXISTS', keys[1], old) == 0 then
      code = 0
    elseif redis.call('HEXISTS', keys[1], new) == 1
        or redis.call('EXISTS', tag .. ':z:' .. new, tag .. ':h:' .. new, tag .. ':f:' .. new) > 0 then
      code = 2
    else
      for _, kind in ipairs(kinds) do
        if redis.call('EXISTS', tag .. kind .. old) == 1 then
          redis.call('RENAME', tag .. kind .. old, tag .. kind .. new)
        end
      end
      -- Added before the earlier entry goes, so neither index is ever empty (and deleted with
      -- its expiry) in between.
      redis.call('HSET', keys[1], new, redis.call('HGET', keys[1], old))
      redis.call('HDEL', keys[1], old)
      local lease = redis.call('ZSCORE', keys[2], old)
      if lease or release_due(tag, new) then
        redis.call('ZADD', keys[2], lease or now, new)
        entered = true
      end
      redis.call('ZREM', keys[2], old)
    end
    out[#out + 1] = code
  end
  -- A T:rel created here expires with T:parked, as every write of a key's state keeps them.
  local ttl = redis.call('PTTL', keys[1])
  if entered and ttl > 0 and redis.call('PTTL', keys[2]) == -1 then
    redis.call('PEXPIRE', keys[2], ttl)
  end
  return out
end

redis.register_function('gd_rename', rename)
