#!lua name=pipeline_capacity
-- The arrival history's writes (pipeline/capacity/history.py), each applied at most once.
-- A recorder keeps a flush that failed and sends it again; when Redis had applied it and only
-- the reply was lost (a stall past the socket timeout, a dropped connection), the increments
-- would be added twice. Each flush of a lane therefore carries its writer's id and its number,
-- kept as a field of {P:cap:LANE}:f:WRITER until the writer has its reply and clears it.

-- cap_add: add one flush's arrivals of one lane, unless this flush was added before.
-- KEYS[1] the writer's flushes {P:cap:LANE}:f:WRITER (hash: flush number -> 1)
-- KEYS[2..] the lane's day keys {P:cap:LANE}:a:DAY (1440 u32 counters each)
-- ARGV[1] seconds the day keys and the flushes' hash are kept   ARGV[2] the flush's number
-- ARGV[3..] for each day key in order: its number of minutes n, then n (minute, count) pairs
-- Returns 1 if added, 0 if the flush had been added before.
local function add(keys, args)
  if redis.call('HSETNX', keys[1], args[2], '1') == 0 then return 0 end
  redis.call('EXPIRE', keys[1], args[1])
  local at = 3
  for i = 2, #keys do
    local n = tonumber(args[at])
    local cmd = {'BITFIELD', keys[i], 'OVERFLOW', 'SAT'}
    for j = 1, n do
      local minute, count = args[at + 2 * j - 1], args[at + 2 * j]
      cmd[#cmd + 1] = 'INCRBY'; cmd[#cmd + 1] = 'u32'
      cmd[#cmd + 1] = '#' .. minute; cmd[#cmd + 1] = count
    end
    -- the day's last counter: every day key holds all 1440, so a short read is a missing day
    cmd[#cmd + 1] = 'INCRBY'; cmd[#cmd + 1] = 'u32'; cmd[#cmd + 1] = '#1439'; cmd[#cmd + 1] = '0'
    redis.call(unpack(cmd))
    redis.call('EXPIRE', keys[i], args[1])
    at = at + 1 + 2 * n
  end
  return 1
end

redis.register_function('cap_add', add)
