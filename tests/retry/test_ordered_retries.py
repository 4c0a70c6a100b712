"""Ordered retries keep per-key order (parking), sequenced dead letters and poison messages."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

from contract.helpers import consume_until
from redis.asyncio import Redis
from runtime.helpers import FAST, declare, eventually, flaky_head, lane_spec, running
from support import delete_group_after

from pipeline import headers as h
from pipeline.envelope import Record
from pipeline.errors import Retry
from pipeline.runtime import App, Context
from pipeline.runtime.member import Member
from pipeline.topics.spec import TopicSpec
from pipeline.transport.protocol import Transport


async def test_a_failed_message_holds_back_the_rest_of_its_key(
    transport: Transport, redis: Redis, unique: str
) -> None:
    """Later messages of a key wait behind its retrying head; other keys are not held back."""
    spec = lane_spec(f"park_{unique}", 2, retry={"tiers": ["200ms", "300ms"]})
    await declare(transport, spec)
    app, completed, _ = flaky_head(spec, failures=2)

    records = [
        Record(b"a1", b"a"),
        Record(b"b1", b"b"),
        Record(b"a2", b"a"),
        Record(b"b2", b"b"),
        Record(b"a3", b"a"),
    ]
    producer = transport.producer()
    await producer.send_many(spec.name, records)
    member = Member(app, transport, f"g-{unique}", FAST, redis=redis, redis_prefix=f"t{unique}")
    async with running(member):
        await eventually(lambda: len(completed[b"a"]) == 3 and len(completed[b"b"]) == 2)
        # A key that arrives after the head recovered flows normally again.
        await producer.send(spec.name, b"a4", key=b"a")
        await eventually(lambda: len(completed[b"a"]) == 4)
    await producer.close()
    assert completed[b"a"] == [b"a1", b"a2", b"a3", b"a4"]
    assert completed[b"b"] == [b"b1", b"b2"]
    assert member.stats.retried == 2
    assert member.stats.parked == 2  # a2 and a3, each held once
    # Followers are held in Redis, not cycled: the tiers saw a1's two retries and nothing else.
    admin = transport.admin()
    tier_entries = 0
    for tier in spec.retry_topic_names():
        tier_entries += sum(p.end for p in await admin.group_lag(f"none-{unique}", tier))
    assert tier_entries == 2
    left = await redis.keys(f"{{t{unique}:guard:*")
    # Only the expiring duplicate filter, the members' liveness (and start marks, if any) are
    # left; nothing parked.
    assert all(k.endswith((b":gone", b":run", b":live")) for k in left), left
    assert all(ttl > 0 for ttl in [await redis.pttl(k) for k in left])


async def test_followers_of_a_dead_lettered_head_follow_it_in_order(
    transport: Transport, redis: Redis, unique: str
) -> None:
    """An exhausted head is followed to the DLQ, in order, by those parked behind it."""
    spec = lane_spec(f"seq_{unique}", 1, retry={"tiers": ["200ms"], "max_attempts": 2})
    await declare(transport, spec)
    app = App([spec])
    ran: list[bytes] = []

    @app.handler(spec.lane)
    async def handle(event: bytes, ctx: Context) -> None:
        ran.append(event)
        if event == b"k1":
            raise Retry("never works")

    producer = transport.producer()
    await producer.send_many(
        spec.name,
        [Record(b"k1", b"k"), Record(b"k2", b"k"), Record(b"k3", b"k"), Record(b"other", b"o")],
    )
    await producer.close()
    member = Member(app, transport, f"g-{unique}", FAST, redis=redis, redis_prefix=f"t{unique}")
    async with running(member):
        await eventually(lambda: member.stats.dead_lettered == 3)
    assert ran in ([b"k1", b"other", b"k1"], [b"other", b"k1", b"k1"])
    dlq = transport.consumer(f"dlq-{unique}", [spec.dead_letter])
    dead = await consume_until(dlq, lambda r: len(r) >= 3)
    await dlq.close()
    assert [m.value for m in dead] == [b"k1", b"k2", b"k3"]
    assert [m.headers[h.DEAD_REASON] for m in dead] == [b"exhausted", b"sequenced", b"sequenced"]
    # Every dead letter says what ended it and after how many attempts.
    assert [m.headers[h.ERROR_CLASS] for m in dead] == [
        b"pipeline.errors.Retry",
        b"pipeline.errors.SequencedDeadLetter",
        b"pipeline.errors.SequencedDeadLetter",
    ]
    assert all(m.headers[h.ERROR_MESSAGE] for m in dead)
    assert [m.headers[h.ATTEMPT] for m in dead] == [b"2", b"1", b"1"]


async def _crash_until_done(
    transport: Transport, spec: TopicSpec, unique: str, done_key: str, want: int, **extra: str
) -> int:
    """Start ``poison_app`` members one after another until the poison is dead-lettered.

    ``want`` values must be handled too. Returns how many of them crashed (exit 17, the
    poison's doing) before that.
    """
    topic = spec.name
    admin = transport.admin()
    delete_group_after(transport, f"g-{unique}", spec.topic_names())  # its members are processes

    async def settled() -> bool:
        if await redis.scard(done_key) < want:
            return False
        return sum(p.end for p in await admin.group_lag(f"none-{unique}", spec.dead_letter)) > 0

    env = {
        **os.environ,
        "POISON_TOPIC": topic,
        "POISON_DONE": done_key,
        "PIPELINE_RUNTIME__COMMIT_INTERVAL_MS": "50",
        "PIPELINE_RUNTIME__LIVENESS_MS": "1500",  # a crashed member's suspects wait this long
        "PIPELINE_KAFKA__SESSION_TIMEOUT_MS": "3000",
        "PIPELINE_REDIS__LEASE_MS": "1500",
        "PIPELINE_REDIS__HEARTBEAT_MS": "100",
        **extra,
    }
    redis = Redis.from_url(env.get("PIPELINE_REDIS__URL", "redis://127.0.0.1:6379/0"))
    crashes = 0
    try:
        for _ in range(6):
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "pipeline",
                "consume",
                "runtime.poison_app:app",
                "--group",
                f"g-{unique}",
                "-t",
                transport.name,
                cwd=str(Path(__file__).parents[1]),
                env=env,
            )
            finished = asyncio.create_task(proc.wait())
            while not finished.done() and not await settled():
                await asyncio.wait({finished}, timeout=0.1)
            if finished.done():
                assert proc.returncode == 17
                crashes += 1
                continue
            proc.send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(finished, 60) == 0
            break
    finally:
        await redis.aclose()
    return crashes


async def _dead_letters(
    transport: Transport, spec_dlq: str, unique: str
) -> list[tuple[bytes, bytes]]:
    """The poison dead letter: its value and error message."""
    dlq = transport.consumer(f"dlq-{unique}", [spec_dlq])
    (dead,) = await consume_until(dlq, lambda r: len(r) >= 1)
    await dlq.close()
    assert dead.headers[h.DEAD_REASON] == b"poison"
    assert dead.headers[h.ERROR_CLASS] == b"pipeline.errors.PoisonMessage"
    assert b"interrupted" in dead.headers[h.ERROR_MESSAGE]
    assert h.ATTEMPT in dead.headers
    return [(dead.value, dead.headers[h.ERROR_MESSAGE])]


async def test_a_message_that_kills_its_worker_is_dead_lettered_as_poison(
    transport: Transport, redis: Redis, unique: str
) -> None:
    """After poison_after (3) counted crashes the message goes to the DLQ; the rest flows.

    Its first crash strikes under the member's claim, where nothing tells it from the messages
    claimed beside it: that one is not counted, so the member crashes four times.
    """
    spec = lane_spec(f"poison_{unique}", 1, retry={"tiers": ["200ms"]})
    await declare(transport, spec)
    producer = transport.producer()
    await producer.send_many(
        spec.name,
        [
            Record(b"m1", b"k"),
            Record(b"poison", b"k"),
            Record(b"m2", b"k"),
            Record(b"m3", b"other"),
        ],
    )
    await producer.close()
    done_key = f"done-{unique}"
    assert await _crash_until_done(transport, spec, unique, done_key, 3) == 4
    assert await redis.smembers(done_key) == {b"m1", b"m2", b"m3"}
    assert await _dead_letters(transport, spec.dead_letter, unique) == [
        (b"poison", b"its processing was interrupted 4 times (2 of them alone)")
    ]
    await redis.delete(done_key)


async def test_a_neighbour_running_beside_a_poison_message_is_not_blamed(
    transport: Transport, redis: Redis, unique: str
) -> None:
    """A slow message of another key runs beside the poison when it first kills the member.

    Neither crash before they are suspects is counted (the first under the claim, the second
    with both running again on the inheritor's exact path); then each runs alone, so the slow
    one finishes and only the poison is dead-lettered, after the same four crashes.
    """
    spec = lane_spec(f"poison_{unique}", 1, retry={"tiers": ["200ms"]})
    await declare(transport, spec)
    producer = transport.producer()
    await producer.send_many(spec.name, [Record(b"slow", b"a"), Record(b"poison", b"b")])
    await producer.close()
    done_key = f"done-{unique}"
    crashes = await _crash_until_done(transport, spec, unique, done_key, 1, POISON_NEIGHBOUR="slow")
    assert crashes == 4
    assert await redis.smembers(done_key) == {b"slow"}
    assert [v for v, _ in await _dead_letters(transport, spec.dead_letter, unique)] == [b"poison"]
    await redis.delete(done_key, f"{done_key}:poison", f"{done_key}:slow")
