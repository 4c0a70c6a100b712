"""A lane that no longer parks still releases the followers it parked while it did.

A real member parks a key (its head failed into a retry tier, a follower held in Redis with its
offset committed); the lane is then declared unordered, or left without retry tiers, and a member
of the new declaration runs it.
"""

from __future__ import annotations

from collections import defaultdict

import pytest
from redis.asyncio import Redis
from runtime.helpers import FAST, declare, eventually, lane_spec, produce, running

from pipeline.envelope import Record
from pipeline.retry.keys import guard_keys
from pipeline.runtime import App, Context
from pipeline.runtime.member import Member
from pipeline.topics.spec import TopicSpec
from pipeline.transport.protocol import Transport

Ran = defaultdict[bytes, list[bytes]]


async def _parked(
    transport: Transport, redis: Redis, unique: str, ran: Ran
) -> tuple[TopicSpec, str]:
    """Key ``a`` parked on an ordered lane with a 3 s tier: a1 in the tier, a2 held; its prefix."""
    spec = lane_spec(f"drain_{unique}", 1, retry={"tiers": ["3s"]})
    await declare(transport, spec)
    prefix = f"t{unique}"
    await produce(transport, spec.name, [Record(b"a1", b"a"), Record(b"a2", b"a")])
    member = Member(
        _app(spec, ran), transport, f"g-{unique}", FAST, redis=redis, redis_prefix=prefix
    )
    async with running(member):  # stopped before a1's copy is due: a2 waits held in Redis
        await eventually(lambda: member.stats.retried == 1 and member.stats.parked == 1)
    assert await redis.hlen(guard_keys(prefix, spec.lane).parked) == 1
    assert ran[b"a"] == []
    return spec, prefix


def _app(spec: TopicSpec, ran: Ran, failing: int = 1) -> App:
    """A lane whose handler fails a1's first ``failing`` attempts and records every other run."""

    async def handle(event: bytes, ctx: Context) -> None:
        if event == b"a1" and ctx.attempt <= failing:
            raise RuntimeError("dependency down")
        ran[ctx.message.key or b""].append(event)

    app = App([spec])
    app.handler(spec.lane)(handle)
    return app


DRAINED = "parked before the lane stopped parking"
"""What a reap tick logs of a follower it released because its lane no longer parks."""


async def test_a_lane_made_unordered_runs_the_held_follower_after_its_heads_copy(
    transport: Transport, redis: Redis, unique: str, caplog: pytest.LogCaptureFixture
) -> None:
    """ordered: true -> false: a1's copy comes back from its tier, and its end releases a2."""
    ran: Ran = defaultdict(list)
    before, prefix = await _parked(transport, redis, unique, ran)
    unordered = before.model_copy(update={"ordered": False})
    app = _app(unordered, ran)
    member = Member(app, transport, f"g-{unique}", FAST, redis=redis, redis_prefix=prefix)
    async with running(member):
        await eventually(lambda: ran[b"a"] == [b"a1", b"a2"])
        await produce(transport, before.name, [Record(b"a3", b"a")])
        await eventually(lambda: ran[b"a"] == [b"a1", b"a2", b"a3"])
    keys = guard_keys(prefix, before.lane)
    assert await redis.hlen(keys.parked) == 0
    assert await redis.zcard(keys.releases) == 0
    # Released by the end of a1's copy, run as its key's head, not by the reap's drain.
    assert not [r for r in caplog.records if DRAINED in r.getMessage()]


async def test_a_heads_copy_that_fails_again_keeps_its_follower_held_behind_it(
    transport: Transport, redis: Redis, unique: str
) -> None:
    """ordered: true -> false and a1's copy fails again: a2 waits for a1's next attempt.

    The copy ran as its key's head; failing, it stays the head (its mark kept for its next
    copy), so a2 is not released before a1 has succeeded, and a1 is not run twice.
    """
    ran: Ran = defaultdict(list)
    before, prefix = await _parked(transport, redis, unique, ran)
    unordered = lane_spec(before.name, 1, ordered=False, retry={"tiers": ["3s"], "max_attempts": 3})
    member = Member(
        _app(unordered, ran, failing=2),
        transport,
        f"g-{unique}",
        FAST,
        redis=redis,
        redis_prefix=prefix,
    )
    async with running(member):
        await eventually(lambda: len(ran[b"a"]) == 2)
        assert member.stats.retried == 1  # a1's second attempt went to the tier again
    assert ran[b"a"] == [b"a1", b"a2"]
    keys = guard_keys(prefix, before.lane)
    assert await redis.hlen(keys.parked) == 0


async def test_a_lane_left_without_tiers_releases_the_follower_whose_head_never_comes_back(
    transport: Transport, redis: Redis, unique: str, caplog: pytest.LogCaptureFixture
) -> None:
    """retry.tiers removed: a1's copy waits in a tier no member reads; a2 runs all the same."""
    ran: Ran = defaultdict(list)
    before, prefix = await _parked(transport, redis, unique, ran)
    untiered = lane_spec(before.name, 1)
    assert untiered.ordered
    assert not untiered.retry.tiers_ms
    member = Member(
        _app(untiered, ran), transport, f"g-{unique}", FAST, redis=redis, redis_prefix=prefix
    )
    async with running(member):
        await eventually(lambda: ran[b"a"] == [b"a2"])
        await produce(transport, before.name, [Record(b"a3", b"a")])
        await eventually(lambda: ran[b"a"] == [b"a2", b"a3"])
    keys = guard_keys(prefix, before.lane)
    assert await redis.hlen(keys.parked) == 0
    assert await redis.zcard(keys.releases) == 0
    [drained] = [r.getMessage() for r in caplog.records if DRAINED in r.getMessage()]
    assert drained.startswith(f"releasing {before.name}:0:1 on lane {before.lane}")
