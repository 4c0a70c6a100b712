#!lua name=pipeline_lane_lease
-- The group lease of a lane (pipeline/runtime/lane_lease.py): a lane is consumed by one group
-- at a time. A hash {P:guard:LANE}:group holds the group ("group"), when a member last renewed
-- it ("at", ms on this Redis's clock), that member's lease ("lease", ms) and one field
-- "m:<member token>" per member of the group holding it, with the time its hold ends (ms). The
-- key expires a lease after the last renewal of any of its members.

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- pl_lane_hold: take the lane for a group, or renew the group's lease.
-- KEYS[1] the lease   ARGV[1] group   ARGV[2] member token   ARGV[3] lease_ms
-- Returns {1, group, at, lease_ms, now} if the group holds it now, else {0, the holding group,
-- its last renewal (at), its lease_ms, now}.
local function hold(keys, args)
  local now = now_ms()
  local held = redis.call('HMGET', keys[1], 'group', 'at', 'lease')
  if held[1] and held[1] ~= args[1] then
    return {0, held[1], tonumber(held[2]) or 0, tonumber(held[3]) or 0, now}
  end
  local lease = tonumber(args[3])
  local fields = redis.call('HGETALL', keys[1])
  for i = 1, #fields, 2 do  -- members whose hold ended (stopped without leaving) are forgotten
    local name = fields[i]
    if string.sub(name, 1, 2) == 'm:' and tonumber(fields[i + 1]) <= now then
      redis.call('HDEL', keys[1], name)
    end
  end
  redis.call('HSET', keys[1], 'group', args[1], 'at', now, 'lease', lease,
    'm:' .. args[2], now + lease)
  if redis.call('PTTL', keys[1]) < lease then  -- never shortens another member's longer lease
    redis.call('PEXPIRE', keys[1], lease)
  end
  return {1, args[1], now, lease, now}
end

-- pl_lane_leave: a member of the holding group stops; the lane is free once none holds it.
-- KEYS[1] the lease   ARGV[1] group   ARGV[2] member token
-- Returns 1 if the lane is free now, 0 if another live member of the group still holds it,
-- -1 if the lease names another group (or none): left alone.
-- A lease kept by other members ends when the last of their holds ends: the leaving member's
-- own (longer, or renewed later) hold no longer keeps the lane from another group.
local function leave(keys, args)
  if redis.call('HGET', keys[1], 'group') ~= args[1] then return -1 end
  redis.call('HDEL', keys[1], 'm:' .. args[2])
  local now = now_ms()
  local fields = redis.call('HGETALL', keys[1])
  local last = 0
  for i = 1, #fields, 2 do
    local ends = tonumber(fields[i + 1])
    if string.sub(fields[i], 1, 2) == 'm:' and ends > now and ends > last then last = ends end
  end
  if last == 0 then
    redis.call('DEL', keys[1])
    return 1
  end
  redis.call('PEXPIRE', keys[1], last - now)
  return 0
end

redis.register_function('pl_lane_hold', hold)
redis.register_function('pl_lane_leave', leave)
