"""The sweeper does not replay a webhook that is late, not lost: one waiting in a retry tier."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from contract.helpers import consume_until, make_topic
from logstore.helpers import FakeClock, new_row

from pipeline.config import IngressSettings, Settings, SweeperSettings
from pipeline.ingress.service import build_sweeper
from pipeline.logstore import RowState
from pipeline.logstore.sqlite import SqliteLogStore
from pipeline.topics.spec import load_specs
from pipeline.transport import create_transport
from pipeline.transport.protocol import Transport


@pytest.fixture
async def redis(settings: Settings, redis_service: str) -> AsyncIterator[Transport]:
    """The real Redis Streams transport."""
    transport = create_transport(settings, "redis")
    yield transport
    await transport.close()


async def test_a_row_whose_event_waits_in_a_retry_tier_is_not_replayed(
    tmp_path: Path, redis: Transport, unique: str
) -> None:
    """A row past patience whose event waits in its lane's retry tier counts as backed up."""
    topic, lane, group = f"messages-{unique}", f"lane_{unique}", f"g-{unique}"
    (tmp_path / "topics").mkdir()
    (tmp_path / "topics" / "lane.yaml").write_text(
        f"name: {topic}\npartitions: 1\nlane: {lane}\nretry:\n  tiers: [5s, 1m, 10m]\n"
    )
    specs = load_specs(tmp_path / "topics")
    tier = specs[0].retry_topic_names()[-1]
    for name in (topic, *specs[0].retry_topic_names()):
        await make_topic(redis, name, 1)
    # The first attempt was read and committed; it failed, and its copy waits in the 10m tier.
    await redis.producer().send(topic, b"first attempt", key=b"k")
    consumer = redis.consumer(group, [topic])
    await consume_until(consumer, lambda got: len(got) >= 1)
    await consumer.close()
    await redis.producer().send(tier, b"retry copy, due in 10 minutes", key=b"k")

    clock = FakeClock(start_s=time.time() - 400)  # produced 400 s ago: past patience (300 s)
    store = SqliteLogStore(tmp_path / "log.db", clock=clock)
    await store.open()
    try:
        row = new_row(1, clock, topic=topic, lane=lane)
        await store.insert(row)
        await store.mark_produced([row.id])
        ingress = IngressSettings(
            sweeper=SweeperSettings(patience_s=300, max_patience_s=900, lane_groups={lane: group})
        )
        sweeper = build_sweeper(store, redis.producer(), redis.admin(), specs, ingress)
        report = await sweeper.sweep_once()
        got = await store.get(row.id)
    finally:
        await store.close()
    assert report.patient_lanes == (lane,)
    assert report.replayed == 0
    assert got is not None
    assert (got.state, got.replay_count) == (RowState.PRODUCED, 0)
