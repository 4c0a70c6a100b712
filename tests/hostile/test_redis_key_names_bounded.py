"""Redis key names built from a producer's bytes are bounded (``pipeline/redis_keys.py``).

A producer controls the message key, the ``pl-tenant`` and ``pl-event-id`` headers and the JSON
fields; the runtime names Redis keys after them (throttle keys, debounce conversations,
``ctx.once`` records, parked keys). Each test runs a real member on Redis Streams against the
real Redis with 1 MiB values, looks at every key of the run while its handler runs, and checks
that no name is longer than the bound plus the fixed parts, that two messages with the same huge
value share their keys, and that the messages are handled.
"""

from __future__ import annotations

import json
import logging

import pytest
from redis.asyncio import Redis
from runtime.helpers import FAST, declare, eventually, lane_spec, produce, running

from pipeline import headers as h
from pipeline.admission.keys import key_text, limit_stats
from pipeline.admission.throttle import Throttle
from pipeline.envelope import Record
from pipeline.errors import Retry
from pipeline.redis_keys import HEAD_CHARS, NAME_PART_MAX_BYTES, bounded, digest
from pipeline.retry.keys import encode_key
from pipeline.runtime import App, Context
from pipeline.runtime.keys import once_key
from pipeline.runtime.member import Member
from pipeline.transport.protocol import Transport

MIB = 1 << 20
ALONE = MIB - 4096
"""A part alone in its message: all the message may carry (``max_message_bytes``, 1.06 MiB)."""
SHARED = MIB // 4
"""Each of four parts of one message."""
LONGEST_NAME = NAME_PART_MAX_BYTES + 200
"""The bound plus the fixed parts: prefix, lane (with the test's unique suffix), markers."""
LONGEST_LOG_LINE = 16 * 1024


def huge(mark: str, size: int = ALONE) -> str:
    """A value of ``size`` bytes, told apart from the others by ``mark`` at its end."""
    return "v" * (size - len(mark)) + mark


async def names_of(redis: Redis, unique: str) -> dict[bytes, int]:
    """Every key of the test's run (their names hold ``unique``), with its memory in bytes."""
    names = [name async for name in redis.scan_iter(match=f"*{unique}*", count=1000)]
    return {name: await redis.memory_usage(name) or 0 for name in names}


class Seen:
    """The key names seen while handlers ran, the longest log line, and the handled messages."""

    def __init__(self, redis: Redis, unique: str) -> None:
        """Nothing seen yet of the run whose key names hold ``unique``."""
        self.redis = redis
        self.unique = unique
        self.names: dict[bytes, int] = {}
        self.handled = 0

    async def look(self) -> set[bytes]:
        """Note the keys there are now; return their names."""
        now = await names_of(self.redis, self.unique)
        self.names.update(now)
        return set(now)

    def check(self, caplog: pytest.LogCaptureFixture) -> None:
        """No key name seen is longer than the bound and the fixed parts; no log line is long."""
        longest = max(self.names, key=len)
        assert len(longest) <= LONGEST_NAME, (len(longest), longest[:120], self.names[longest])
        lines = [record.getMessage() for record in caplog.records]
        assert max(map(len, lines), default=0) <= LONGEST_LOG_LINE


def test_a_part_at_or_under_the_bound_keeps_its_form_and_a_longer_one_its_digest() -> None:
    """Existing keys keep their names; longer parts are digested, equal ones alike."""
    at_bound = "é" * (NAME_PART_MAX_BYTES // 2)
    assert bounded(at_bound) == at_bound
    assert bounded("org:acme") == "org:acme"
    over = at_bound + "x"
    assert bounded(over) == digest(over.encode()) == bounded(over[:-1] + "x")
    assert bounded(huge("a")) != bounded(huge("b"))
    assert bounded(bounded(huge("a"))) == bounded(huge("a"))
    assert len(encode_key(b"k" * 768)) == NAME_PART_MAX_BYTES
    assert encode_key(b"k" * 769) == digest(b"k" * 769)
    assert encode_key(huge("a").encode()) != encode_key(huge("b").encode())
    assert len(once_key("p", "lane", huge("e"), "charge")) <= LONGEST_NAME
    assert len(limit_stats("p", huge("t"))) <= LONGEST_NAME
    assert key_text(huge("t")) == huge("t")[:HEAD_CHARS] + bounded(huge("t"))


async def test_a_throttled_lane_with_huge_keys_tenant_and_fields(
    streams: Transport, redis: Redis, unique: str, caplog: pytest.LogCaptureFixture
) -> None:
    """256 KiB message keys, tenants, JSON fields and event ids: bounded names, shared keys."""
    caplog.set_level(logging.INFO)
    spec = lane_spec(
        f"thrhuge_{unique}",
        1,
        throttle={"keys": ["org:{tenant}", "msg:{key}", "sub:{tenant}/{customer_id}"]},
    )
    await declare(streams, spec)
    app = App([spec])
    seen = Seen(redis, unique)
    effects: list[int] = []
    held: dict[int, set[bytes]] = {}
    holders = f"{{t{unique}:thr:{unique}}}:h:".encode()

    @app.handler(spec.lane)
    async def handle(event: bytes, ctx: Context) -> None:
        n = json.loads(event)["n"]

        async def effect() -> None:
            effects.append(n)

        await ctx.once("charge", effect)
        names = await seen.look()  # while it holds its slots, after its once record
        held[n] = {name for name in names if name.startswith(holders)}
        seen.handled += 1

    tenant, key, customer, event_id = (huge(mark, SHARED) for mark in "tkce")
    records = [
        Record(
            json.dumps({"n": n, "customer_id": customer}).encode(),
            key.encode(),
            headers={h.TENANT: tenant.encode(), h.EVENT_ID: event_id.encode()},
        )
        for n in range(2)
    ]
    await produce(streams, spec.name, records)
    throttle = Throttle(redis, prefix=f"t{unique}", namespace=unique, default_limit=1)
    await throttle.start()
    member = Member(
        app, streams, f"g-{unique}", FAST, redis=redis, redis_prefix=f"t{unique}", throttle=throttle
    )
    try:
        async with running(member):
            await eventually(lambda: seen.handled == 2)
        await seen.look()
    finally:
        await throttle.close()
    seen.check(caplog)
    assert effects == [0]  # one once record for both deliveries of the event
    # Both messages held the same three throttle keys, each under a bounded name.
    assert held[0] == held[1]
    assert len(held[0]) == 3, held
    assert held[0] == held[1]
    assert len(held[0]) == 3, held


async def test_a_debounced_lane_with_a_huge_conversation_key(
    streams: Transport, redis: Redis, unique: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Two messages of one 1 MiB conversation key (JSON field): one turn, bounded names."""
    caplog.set_level(logging.INFO)
    # Quiet long enough that the two are one turn on a loaded host: at 0.3 s, a stall of the
    # member between its two records (each sends the 1 MiB key) let the first fall due alone.
    debounce = {"key": "conversation_id", "quiet_s": 3, "max_wait_s": 20, "max_batch": 50}
    spec = lane_spec(f"debhuge_{unique}", 1, debounce=debounce)
    await declare(streams, spec)
    app = App([spec])
    seen = Seen(redis, unique)
    turns: list[list[int]] = []

    @app.handler(spec.lane)
    async def handle(events: list[bytes], ctx: Context) -> None:
        await seen.look()  # while the turn's buffer and state exist
        turns.append([json.loads(e)["n"] for e in events])
        seen.handled += len(events)

    conversation = huge("c")
    # One message key: messages of different keys are recorded concurrently, so their order in
    # the turn is the order their records reach Redis, not the partition's.
    records = [
        Record(json.dumps({"n": n, "conversation_id": conversation}).encode(), b"k")
        for n in range(2)
    ]
    await produce(streams, spec.name, records)
    member = Member(app, streams, f"g-{unique}", FAST, redis=redis, redis_prefix=f"t{unique}")
    async with running(member):
        await eventually(lambda: seen.handled == 2)
    seen.check(caplog)
    assert turns == [[0, 1]]


async def test_an_ordered_lane_parks_a_huge_key_behind_its_retry(
    streams: Transport, redis: Redis, unique: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A 1 MiB message key parks its next message behind a retry under a bounded name."""
    caplog.set_level(logging.INFO)
    spec = lane_spec(f"parkhuge_{unique}", 1, retry={"tiers": ["1s"]})
    await declare(streams, spec)
    app = App([spec])
    seen = Seen(redis, unique)
    order: list[tuple[int, int]] = []

    @app.handler(spec.lane)
    async def handle(event: bytes, ctx: Context) -> None:
        n = json.loads(event)["n"]
        await seen.look()  # the first's retry run sees the second parked behind it
        order.append((n, ctx.attempt))
        if n == 0 and ctx.attempt == 1:
            raise Retry("once more")
        seen.handled += 1

    key = huge("k").encode()
    records = [Record(json.dumps({"n": n}).encode(), key) for n in range(2)]
    await produce(streams, spec.name, records)
    member = Member(app, streams, f"g-{unique}", FAST, redis=redis, redis_prefix=f"t{unique}")
    async with running(member):
        await eventually(lambda: seen.handled == 2)
    seen.check(caplog)
    assert order == [(0, 1), (0, 2), (1, 1)]
    assert any(encode_key(key).encode() in name for name in seen.names), list(seen.names)
