"""A lane's guard state outlives its topic: a new message at a finished one's position.

The guard records a message that left its parked key by its first delivery's position
(``topic:partition:offset``). A topic deleted and created again starts at offset 0 once more,
while the lane's Redis state (same key prefix) stays: a new message at a reused position that
fails once has its retry copy taken for a late duplicate of the old one. Telling the two apart
by their first delivery's time was tried and let a late duplicate of the old one run twice, out
of its key's order; so the drop is said, once per lane, with what to delete, and the message
runs once the lane's guard keys are gone (docs/runtime.md).
"""

from __future__ import annotations

import logging

import pytest
from redis.asyncio import Redis
from runtime.helpers import FAST, declare, eventually, lane_spec, running

from pipeline.runtime import App, Context
from pipeline.runtime.member import Member
from pipeline.topics.admin import apply
from pipeline.topics.spec import TopicSpec
from pipeline.transport.protocol import Transport


def _fails_once(spec: TopicSpec) -> tuple[App, list[tuple[bytes, int]]]:
    """An App whose handler fails every event's first attempt; the (event, attempt) handled."""
    app = App([spec])
    handled: list[tuple[bytes, int]] = []

    @app.handler(spec.lane)
    async def handle(event: bytes, ctx: Context) -> None:
        if ctx.attempt == 1:
            raise RuntimeError("flaky dependency")
        handled.append((event, ctx.attempt))

    return app, handled


async def _run_until_handled(
    app: App, transport: Transport, redis: Redis, unique: str, handled: list[tuple[bytes, int]]
) -> Member:
    member = Member(app, transport, f"g-{unique}", FAST, redis=redis, redis_prefix=f"t{unique}")
    async with running(member):  # until it is handled, or dropped as a duplicate
        await eventually(lambda: bool(handled) or member.stats.duplicates > 0)
    return member


async def test_a_copy_dropped_at_a_finished_position_is_said_and_runs_once_the_keys_are_gone(
    transport: Transport, redis: Redis, unique: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A new message at a recreated topic's ``[0]@0`` whose copy is dropped says so, once.

    The old message there finished on its retry before the topics went and came back. The new
    one's copy was dropped as stale without a line at INFO or above. The WARNING names the
    lane's guard keys; deleted, the same message produced again is handled on its retry.
    """
    spec = lane_spec(f"fh_{unique}", 1, retry={"tiers": ["200ms"]})  # ordered: it parks
    await declare(transport, spec)
    app, handled = _fails_once(spec)
    producer = transport.producer()
    first = await producer.send(spec.name, b"old", key=b"k")
    await producer.close()
    assert first.offset == 0
    await _run_until_handled(app, transport, redis, unique, handled)
    assert handled == [(b"old", 2)]

    admin = transport.admin()
    await admin.delete_group(f"g-{unique}", spec.topic_names())
    for name in spec.topic_names():
        await admin.delete_topic(name)
    await apply(admin, [spec], 100_000, dry_run=False)

    app, handled = _fails_once(spec)
    producer = transport.producer()
    second = await producer.send(spec.name, b"new", key=b"k")
    await producer.close()
    assert (second.partition, second.offset) == (first.partition, first.offset)
    with caplog.at_level(logging.WARNING, logger="pipeline"):
        member = await _run_until_handled(app, transport, redis, unique, handled)
    assert (handled, member.stats.duplicates) == ([], 1)
    (said,) = [r.getMessage() for r in caplog.records if "without running it" in r.getMessage()]
    tag = f"{{t{unique}:guard:{spec.lane}}}"
    assert said.startswith(f"lane {spec.lane}: dropped ")
    assert f"({tag}*)" in said

    async for key in redis.scan_iter(match=f"{tag}*"):  # as the line says, no member running
        await redis.delete(key)
    producer = transport.producer()
    await producer.send(spec.name, b"new", key=b"k")
    await producer.close()
    await _run_until_handled(app, transport, redis, unique, handled)
    assert handled == [(b"new", 2)]
