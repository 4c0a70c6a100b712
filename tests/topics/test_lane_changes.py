"""Changing a lane's declaration while work waits: what `topics apply` warns of, on a real broker.

A retry tier removed (or its delay changed, which renames it) while copies wait in it strands
them: members read only the tiers declared now, and on an ordered lane the key stays parked
behind the copy that never comes back, so the key's later messages are held too. Partitions
added to an ordered lane move keys; a lower retention or ``max_len`` deletes unread work. The
broker takes each change silently; apply says so, one line each, dry run or not.
"""

from __future__ import annotations

import logging
from collections import defaultdict

import pytest
from redis.asyncio import Redis
from runtime.helpers import FAST, declare, eventually, lane_spec, produce, running
from support import delete_after_test

from pipeline.envelope import Record
from pipeline.runtime import App, Context
from pipeline.runtime.member import Member
from pipeline.topics.admin import apply
from pipeline.topics.spec import TopicSpec
from pipeline.transport.protocol import Transport


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "pipeline.topics.admin" and r.levelno == logging.WARNING
    ]


async def _apply(transport: Transport, spec: TopicSpec, *, dry_run: bool = False) -> None:
    delete_after_test(transport, spec.topic_names())
    await apply(transport.admin(), [spec], 100_000, dry_run=dry_run)


async def test_a_removed_tier_holding_a_copy_is_named_and_its_key_stays_parked(
    transport: Transport, redis: Redis, unique: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Tiers [1h] -> [30s] with a copy waiting in the 1h tier: apply names it.

    A member of the new declaration does not read the old tier, and the key's later messages
    stay held behind the copy it never runs.
    """
    before = lane_spec(f"tier_{unique}", 2, retry={"tiers": ["1h"]})
    await declare(transport, before)
    ran: dict[bytes, list[bytes]] = defaultdict(list)

    async def handle(event: bytes, ctx: Context) -> None:
        if event == b"a1":
            raise RuntimeError("dependency down")
        ran[ctx.message.key or b""].append(event)

    app = App([before])
    app.handler(before.lane)(handle)
    await produce(transport, before.name, [Record(b"a1", b"a"), Record(b"a2", b"a")])
    member = Member(app, transport, f"g-{unique}", FAST, redis=redis, redis_prefix=f"t{unique}")
    async with running(member):  # a1's copy waits an hour in the tier; a2 is held behind it
        await eventually(lambda: member.stats.retried == 1 and member.stats.parked == 1)
    tier = f"{before.name}.retry.1h"
    assert (await transport.admin().list_topics([tier]))[tier].message_count == 1

    after = lane_spec(f"tier_{unique}", 2, retry={"tiers": ["30s"]})
    caplog.set_level(logging.WARNING, "pipeline.topics.admin")
    await _apply(transport, after, dry_run=True)
    await _apply(transport, after)
    said = _warnings(caplog)
    assert len(said) == 2, said  # the dry run's line and the run's
    assert said[0] == said[1]
    assert f"retry tier topic(s) {tier} (1 message) no longer declared" in said[0]
    assert f"lane '{after.lane}'" in said[0]
    assert "keep the old tier in retry.tiers until the lane's group has no lag on it" in said[0]

    # What the line warns of: a member of the new declaration never subscribes to the old tier,
    # and the key stays parked, so its new messages are held while other keys run.
    app = App([after])
    app.handler(after.lane)(handle)
    assert tier not in app.topics()
    await produce(transport, after.name, [Record(b"a3", b"a"), Record(b"b1", b"b")])
    member = Member(app, transport, f"g-{unique}", FAST, redis=redis, redis_prefix=f"t{unique}")
    async with running(member):
        await eventually(lambda: ran[b"b"] == [b"b1"] and member.stats.parked == 1)
    assert ran[b"a"] == []


async def test_partitions_added_to_an_ordered_lane_are_warned_of(
    transport: Transport, unique: str, caplog: pytest.LogCaptureFixture
) -> None:
    """2 -> 3 partitions: one line for the ordered lane, none for the unordered one."""
    ordered = lane_spec(f"ord_{unique}", 2, retry={"tiers": ["1s"]})
    loose = lane_spec(f"loose_{unique}", 2, ordered=False)
    await declare(transport, ordered, loose)
    caplog.set_level(logging.WARNING, "pipeline.topics.admin")
    grown = [s.model_copy(update={"partitions": 3}) for s in (ordered, loose)]
    actions = await apply(transport.admin(), grown, 100_000, dry_run=False)
    assert sorted(a.kind for a in actions) == ["add_partitions"] * 5
    said = _warnings(caplog)
    assert len(said) == 1, said
    assert said[0].startswith(f"lane '{ordered.lane}': {ordered.name} goes from 2 to 3 partitions")
    assert "out of order" in said[0]
    assert "no lag" in said[0]


async def test_a_lower_retention_or_max_len_over_waiting_work_is_warned_of(
    transport: Transport, unique: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Kafka deletes by age, Redis Streams trims by length: each lowered keep is one line."""
    spec = lane_spec(f"keep_{unique}", 1, retention="7d", max_len=1000)
    await declare(transport, spec)
    await produce(transport, spec.name, [Record(b"x", b"k")])
    caplog.set_level(logging.WARNING, "pipeline.topics.admin")
    lower = spec.model_copy(update={"retention_ms": 3_600_000, "max_len": 10})
    await apply(transport.admin(), [lower], 100_000, dry_run=True)
    said = _warnings(caplog)
    assert len(said) == 1, said
    if transport.name == "kafka":
        assert said[0].startswith(f"lane '{spec.lane}': retention lowered ({spec.name} 7d -> 1h)")
    else:  # Redis keeps by length; its retention is only shown
        assert said[0].startswith(f"lane '{spec.lane}': max_len lowered ({spec.name} 1000 -> 10)")
    # Raising it, or lowering it on topics that hold nothing, is no hazard.
    caplog.clear()
    higher = spec.model_copy(update={"retention_ms": 30 * 86_400_000, "max_len": 5000})
    await apply(transport.admin(), [higher], 100_000, dry_run=True)
    assert _warnings(caplog) == []
