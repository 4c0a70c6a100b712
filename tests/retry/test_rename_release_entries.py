"""Moving keys parked under their earlier long names enters releases only where one is due.

A moved key whose head waits in a retry tier (the usual state of a parked key) needs no
release: its head's copy, once back, releases its followers. Entered in the lane's ``T:rel``
anyway, as due at time 0, it read as a release past its lease by some 56 years
(``pipeline_held_release_overdue_seconds``, which pages past 600 s) until a reap looked at it,
and every reap, 16 keys at most, took those entries before a release whose member really died.
The earlier layout is written as in ``test_rename_long_parked`` (this build's guard functions,
given the earlier name).
"""

from __future__ import annotations

from redis.asyncio import Redis
from runtime.helpers import lane_spec
from test_rename_long_parked import LONG, earlier_name, finish_head, park, store_of

from pipeline.observability.metrics import Metrics
from pipeline.observability.wiring import held_release_sources
from pipeline.retry.keys import encode_key
from pipeline.retry.rename_long_keys import rename_long_parked

OVERDUE = "pipeline_held_release_overdue_seconds"


async def redis_ms(redis: Redis) -> int:
    """Redis's clock (``TIME``) in ms: the clock of release leases."""
    seconds, micros = await redis.time()
    return int(seconds) * 1000 + int(micros) // 1000


async def test_a_moved_key_whose_head_waits_in_a_tier_is_no_overdue_release(
    redis: Redis, unique: str
) -> None:
    """The gauge reads 0 after the move; the head's copy still releases the followers."""
    store, topic = store_of(redis, unique)
    raw = b"o" * LONG
    head, held = await park(store, topic, earlier_name(raw), raw, 0, followers=2)
    assert await rename_long_parked(redis, f"t{unique}", [store.lane]) == 1
    metrics = Metrics()
    spec = lane_spec(topic, 1, retry={"tiers": ["1s"]})  # the lane store_of parks on
    [source] = held_release_sources(metrics, redis, f"t{unique}", [spec])
    await source.refresh()
    overdue = metrics.registry.get_sample_value(OVERDUE, {"lane": store.lane})
    assert overdue == 0.0, f"{overdue} s past a lease nobody held"
    assert await finish_head(store, topic, head, raw) == held


async def test_moved_keys_do_not_delay_taking_over_a_release_whose_member_died(
    redis: Redis, unique: str
) -> None:
    """20 moved keys (heads in a tier) and a lapsed release: the first reap takes it over."""
    store, topic = store_of(redis, unique)
    for i in range(20):
        raw = f"{i:04d}".encode() * (LONG // 4)
        await park(store, topic, earlier_name(raw), raw, 10 * i, followers=1)
    short = b"died"
    head, [follower] = await park(store, topic, encode_key(short), short, 500, followers=1)
    assert await finish_head(store, topic, head, short) == [follower]
    # Its member died mid-release: the lease ran out a second ago.
    lapsed = await redis_ms(redis) - 1000
    assert await redis.zadd(store.keys.releases, {encode_key(short): lapsed}, xx=True) == 0
    assert await rename_long_parked(redis, f"t{unique}", [store.lane]) == 20
    taken = await store.reap()
    assert [(r.key, r.ident) for r in taken] == [(encode_key(short), follower)]


async def test_a_moved_key_with_no_state_left_is_unparked_by_the_next_reap(
    redis: Redis, unique: str
) -> None:
    """Only its ``T:parked`` field was left (its state expired): entered as due, then gone."""
    store, _ = store_of(redis, unique)
    raw = b"e" * LONG
    await redis.hset(store.keys.parked, earlier_name(raw), 1)
    before = await redis_ms(redis)
    assert await rename_long_parked(redis, f"t{unique}", [store.lane]) == 1
    due = await redis.zscore(store.keys.releases, encode_key(raw))
    assert await redis.zcard(store.keys.releases) == 1
    assert due is not None
    assert before <= due <= await redis_ms(redis), "due when moved, by Redis's clock"
    assert await store.reap() == []
    assert await redis.exists(store.keys.parked, store.keys.releases) == 0
