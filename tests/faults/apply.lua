-- The fault suite's side effect (tests/faults/app.py), applied once per event id at the
-- receiving end, as the idempotency guard's documentation asks of effects that must never repeat.
-- KEYS[1] hash <prefix>:applied   event id -> 1 once the effect has been applied
-- KEYS[2] list <prefix>:order:<key>   "seq:partition:origin offset" in the order effects applied
-- KEYS[3] hash <prefix>:runs      event id -> how many times the guard let the effect run
-- KEYS[4] list <prefix>:reached:<key>   (optional) the seq of every run that reached the effect,
--                                  repeats included, in order: the order an effect that does
--                                  not deduplicate (last writer wins) would be left in
-- ARGV[1] the event id   ARGV[2] the order entry
-- Returns 1 if the effect was applied now, 0 if it had been applied before.
redis.call('HINCRBY', KEYS[3], ARGV[1], 1)
if KEYS[4] then
  redis.call('RPUSH', KEYS[4], string.match(ARGV[2], '^(%d+)'))
end
if redis.call('HSETNX', KEYS[1], ARGV[1], 1) == 0 then
  return 0
end
redis.call('RPUSH', KEYS[2], ARGV[2])
return 1
