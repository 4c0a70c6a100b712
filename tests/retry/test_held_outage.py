"""Held followers of a parked key outlive a consumer outage, as long as their head can be read.

A follower held behind a parked key has its offset committed: Redis keeps its only copy. These
tests take the whole fleet down with the follower held and the head's copy still in its tier,
and bring it back once the outage has outlasted the retry path (the guard's short bound).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
from redis.asyncio import Redis
from runtime.helpers import FAST, declare, eventually, lane_spec

from pipeline.envelope import Message, Record, TopicPartition
from pipeline.retry import guard_store
from pipeline.retry.guard_store import KeyEnds, Start, lane_guards
from pipeline.retry.keys import encode_key
from pipeline.runtime import App, Context
from pipeline.runtime.member import Member
from pipeline.topics.spec import TopicSpec
from pipeline.transport.protocol import Transport

KAFKA_DEFAULT_RETENTION_MS = 7 * 86_400_000


@asynccontextmanager
async def up(member: Member) -> AsyncIterator[Member]:
    """Run ``member``; on exit stop it at once, cancelling what still runs (not committed)."""
    stop, hurry = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(member.run(stop, hurry))
    try:
        yield member
    finally:
        stop.set()
        hurry.set()
        await asyncio.wait_for(task, 60)


async def redis_now_ms(redis: Redis) -> int:
    """Redis's clock (``TIME``), the one its key expiry goes by."""
    seconds, micros = await redis.time()
    return int(seconds) * 1000 + int(micros) // 1000


async def test_a_held_follower_runs_after_an_outage_longer_than_the_retry_path(
    transport: Transport, redis: Redis, unique: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every member down past the retry path's bound: the head's copy and its follower still run."""
    # The retry path's bound shrunk from about an hour to 200 ms * 3 * 2 = 1.2 s.
    monkeypatch.setattr(guard_store, "SLACK_MS", 0)
    bound_ms = 200 * 3 * 2
    spec = lane_spec(f"outage_{unique}", 1, retry={"tiers": ["200ms"]})
    await declare(transport, spec)
    app = App([spec])
    completed: list[bytes] = []
    copy_started = asyncio.Event()
    fleet_back = False

    @app.handler(spec.lane)
    async def handle(event: bytes, ctx: Context) -> None:
        if event == b"a1" and ctx.attempt == 1:
            raise RuntimeError("flaky dependency")
        if event == b"a1" and not fleet_back:
            copy_started.set()
            await asyncio.Event().wait()  # still running when the fleet goes down
        completed.append(event)

    producer = transport.producer()
    await producer.send_many(spec.name, [Record(b"a1", b"a"), Record(b"a2", b"a")])
    await producer.close()
    prefix, group = f"t{unique}", f"g-{unique}"
    first = Member(app, transport, group, FAST, redis=redis, redis_prefix=prefix)
    async with up(first):
        await eventually(lambda: copy_started.is_set() and first.stats.parked == 1)
    # The fleet is down: a2's offset is committed, its only copy is held in Redis.
    store = lane_guards(redis, prefix, [spec])[spec.lane]
    _, _, held = store.keys.of_key(encode_key(b"a"))
    assert await redis.hexists(held, "outage_" + unique + ":0:1")
    # The outage outlasts the retry path, by Redis's clock (the one its expiry goes by).
    down_ms = await redis_now_ms(redis)
    await asyncio.sleep((bound_ms + 100) / 1000)
    assert await redis_now_ms(redis) > down_ms + bound_ms
    assert await redis.hexists(held, "outage_" + unique + ":0:1"), "the held follower expired"
    fleet_back = True
    second = Member(app, transport, group, FAST, redis=redis, redis_prefix=prefix)
    async with up(second):
        await eventually(lambda: completed == [b"a1", b"a2"], timeout_s=30)
    assert await redis.hlen(store.keys.parked) == 0


def messages_lane(name: str) -> TopicSpec:
    """The sample lane of topics/messages.yaml: tiers 5s, 1m, 10m, retention 7 days."""
    return lane_spec(name, 1, retention="7d", retry={"tiers": ["5s", "1m", "10m"]})


async def test_a_parked_keys_state_lives_as_long_as_the_heads_copy_in_its_tier(
    redis: Redis, unique: str
) -> None:
    """A parked key's state and the lane's marks outlive its retention, and so do the claims.

    The marks (``T:run``) and finished ids (``T:gone``) are read again when copies come back
    after the outage (tests/retry/test_marks_outage.py).
    """
    for spec, retention_ms in (
        (messages_lane(f"hold_{unique}"), 7 * 86_400_000),
        (lane_spec(f"dflt_{unique}", 1, retry={"tiers": ["1s"]}), KAFKA_DEFAULT_RETENTION_MS),
        # The longest retention a lane may declare: kept as long as Redis can say.
        (lane_spec(f"long_{unique}", 1, retention=2**63 - 1, retry={"tiers": ["1s"]}), 2**61),
    ):
        store = lane_guards(redis, f"t{unique}", [spec])[spec.lane]
        key = encode_key(b"k")
        head = Start(f"{spec.name}:0:0", key, f"{spec.name}:0:0", ordered=True)
        follower = Start(f"{spec.name}:0:1", key, f"{spec.name}:0:1", ordered=True)
        assert await store.begin_many([], [head]) == [("process", 1)]
        assert await store.route(head, 2, park=True)
        message = Message(spec.name, 0, 1, b"k", b"v")
        assert await store.begin_parked(message, follower) == ("held", 0)
        await store.begin_many([head.end_line + "\t1"], [])
        z, state, held = store.keys.of_key(key)
        for name in (z, state, held, store.keys.parked):
            assert await redis.pttl(name) > retention_ms, name
        assert await redis.pttl(store.keys.run) > retention_ms
        # The head's copy succeeds: its follower is released under a lease as long-lived.
        copy = Start(head.ident, key, f"{spec.name}.retry.x:0:0", ordered=True, attempt=2)
        assert await store.begin_many([], [copy]) == [("head", 1)]
        [released] = await store.end_many([KeyEnds([(copy, "done")], follow_dead=False)])
        assert [r.ident for r in released] == [follower.ident]
        assert await redis.pttl(store.keys.releases) > retention_ms
        assert await redis.pttl(store.keys.gone) > retention_ms
        # The claims of a partition last as long.
        tp = TopicPartition(spec.name, 0)
        await store.take_claims({tp: (0, 10)})
        assert retention_ms < await redis.pttl(store.keys.claims(spec.name, 0)) <= store.hold_ms
        # The follower ends: the drained key's state is deleted, not left to expire.
        rel = Start(follower.ident, key, "rel", ordered=True, attempt=0)
        assert await store.end_many([KeyEnds([(rel, "done")], follow_dead=False)]) == [[]]
        assert await redis.exists(z, state, held) == 0
        assert await redis.hlen(store.keys.parked) == 0
        assert await redis.zcard(store.keys.releases) == 0
