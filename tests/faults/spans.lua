-- The crash-loop scenario's record of handler runs (tests/faults/crashloop_app.py), on one
-- clock: every enter, leave and kill gets the next value of a counter, so the suite can tell
-- from the recorded order alone whether two runs of one key overlapped.
-- KEYS[1] string <prefix>:clock   the counter
-- KEYS[2] list   <prefix>:spans   "token key event-id attempt topic:partition:offset enter" per run
-- KEYS[3] hash   <prefix>:left    run token -> the counter value when the run left the handler
-- ARGV[1] 'enter' or 'leave'   ARGV[2] the run token   ARGV[3] the rest of the spans entry
-- Returns the counter value given to this enter or leave.
local now = redis.call('INCR', KEYS[1])
if ARGV[1] == 'enter' then
  redis.call('RPUSH', KEYS[2], ARGV[2] .. ' ' .. ARGV[3] .. ' ' .. now)
else
  redis.call('HSET', KEYS[3], ARGV[2], now)
end
return now
