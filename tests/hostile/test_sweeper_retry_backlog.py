"""The sweeper does not replay a webhook that is late, not lost: one waiting in a retry tier."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from contract.helpers import consume_until, make_topic
from ingress.helpers import sweep_a_row_produced_ago

from pipeline.config import Settings
from pipeline.logstore import RowState
from pipeline.topics.spec import TopicSpec, load_specs
from pipeline.transport import create_transport
from pipeline.transport.protocol import Transport


@pytest.fixture
async def redis(settings: Settings, redis_service: str) -> AsyncIterator[Transport]:
    """The real Redis Streams transport."""
    transport = create_transport(settings, "redis")
    yield transport
    await transport.close()


async def declare(redis: Transport, tmp_path: Path, declaration: str) -> TopicSpec:
    """Load ``declaration`` as the only topic file and create its main and retry topics."""
    (tmp_path / "topics").mkdir()
    (tmp_path / "topics" / "lane.yaml").write_text(declaration)
    spec = load_specs(tmp_path / "topics")[0]
    for name in (spec.name, *spec.retry_topic_names()):
        await make_topic(redis, name, 1)
    return spec


async def waiting_in_retry_tier(
    redis: Transport, tmp_path: Path, unique: str, tiers: str
) -> tuple[TopicSpec, str]:
    """A lane retried over ``tiers`` and its group, its first attempt failed and waiting in a tier.

    The first attempt was read and committed; it failed, and its copy waits in the last tier.
    """
    topic, lane, group = f"messages-{unique}", f"lane_{unique}", f"g-{unique}"
    declaration = f"name: {topic}\npartitions: 1\nlane: {lane}\nretry:\n  tiers: [{tiers}]\n"
    spec = await declare(redis, tmp_path, declaration)
    await redis.producer().send(spec.name, b"first attempt", key=b"k")
    consumer = redis.consumer(group, [spec.name])
    await consume_until(consumer, lambda got: len(got) >= 1)
    await consumer.close()
    await redis.producer().send(spec.retry_topic_names()[-1], b"retry copy", key=b"k")
    return spec, group


async def test_a_row_whose_event_waits_in_a_retry_tier_is_not_replayed(
    tmp_path: Path, redis: Transport, unique: str
) -> None:
    """A row past patience whose event waits in its lane's retry tier counts as backed up."""
    spec, group = await waiting_in_retry_tier(redis, tmp_path, unique, "5s, 1m, 10m")
    # produced 400 s ago: past patience (300 s)
    report, got = await sweep_a_row_produced_ago(redis, tmp_path, spec, group, 400)
    assert report.patient_lanes == (f"lane_{unique}",)
    assert report.replayed == 0
    assert got is not None
    assert (got.state, got.replay_count) == (RowState.PRODUCED, 0)


async def test_a_retry_path_longer_than_max_patience_is_waited_out(
    tmp_path: Path, redis: Transport, unique: str
) -> None:
    """A backed-up lane whose tiers sum past max_patience_s is replayed only after them."""
    spec, group = await waiting_in_retry_tier(redis, tmp_path, unique, "1m, 10m, 1h")
    # 1000 s ago: past max_patience_s (900 s), inside the retries' 71 minutes plus patience
    report, got = await sweep_a_row_produced_ago(redis, tmp_path, spec, group, 1000)
    assert report.replayed == 0
    assert got is not None
    assert (got.state, got.replay_count) == (RowState.PRODUCED, 0)


async def test_a_row_past_its_lanes_retry_path_is_replayed(
    tmp_path: Path, redis: Transport, unique: str
) -> None:
    """Past the lane's retries (71 minutes) plus patience, a backed-up lane's row is replayed."""
    spec, group = await waiting_in_retry_tier(redis, tmp_path, unique, "1m, 10m, 1h")
    report, got = await sweep_a_row_produced_ago(redis, tmp_path, spec, group, 4260 + 300 + 60)
    assert report.replayed == 1
    assert got is not None
    assert got.replay_count == 1


async def test_a_batch_lane_is_given_its_sla(tmp_path: Path, redis: Transport, unique: str) -> None:
    """A batch message waiting for idle capacity within its SLA (12 h) is not replayed."""
    topic, lane, group = f"reports-{unique}", f"lane_{unique}", f"g-{unique}"
    spec = await declare(
        redis, tmp_path, f"name: {topic}\npartitions: 1\nlane: {lane}\nbatch:\n  sla: 12h\n"
    )
    # The batch message waits, read but not committed: the group's lag over the main topic.
    await redis.producer().send(spec.name, b"waits for idle capacity", key=b"k")
    consumer = redis.consumer(group, [spec.name])
    await consumer.close()
    report, got = await sweep_a_row_produced_ago(redis, tmp_path, spec, group, 3600)
    assert report.patient_lanes == (lane,)
    assert report.replayed == 0
    assert got is not None
    assert (got.state, got.replay_count) == (RowState.PRODUCED, 0)
