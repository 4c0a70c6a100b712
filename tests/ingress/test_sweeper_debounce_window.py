"""The sweeper does not replay a webhook whose event waits in its lane's debounce window."""

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


async def debounced_lane(
    redis: Transport, tmp_path: Path, unique: str, window: str, *, backed_up: bool = False
) -> tuple[TopicSpec, str]:
    """A debounced lane whose group read and committed its message (recorded, waiting its turn).

    With ``backed_up`` one more message waits unread in the lane's topic.
    """
    topic, lane, group = f"digests-{unique}", f"lane_{unique}", f"g-{unique}"
    (tmp_path / "topics").mkdir()
    (tmp_path / "topics" / "lane.yaml").write_text(
        f"name: {topic}\npartitions: 1\nlane: {lane}\n"
        f"debounce:\n  key: conversation_id\n  {window}\n"
    )
    spec = load_specs(tmp_path / "topics")[0]
    await make_topic(redis, topic, 1)
    await redis.producer().send(topic, b"recorded into its conversation's buffer", key=b"k")
    consumer = redis.consumer(group, [topic])
    await consume_until(consumer, lambda got: len(got) >= 1)
    await consumer.close()
    if backed_up:
        await redis.producer().send(topic, b"not read yet", key=b"k")
    return spec, group


async def test_a_row_waiting_in_a_debounce_window_past_patience_is_not_replayed(
    tmp_path: Path, redis: Transport, unique: str
) -> None:
    """A calm debounced lane's row inside its max_wait_s plus patience is left to its turn."""
    spec, group = await debounced_lane(redis, tmp_path, unique, "quiet_s: 600\n  max_wait_s: 1800")
    # 400 s ago: past patience (300 s), inside the turn's latest time (1800 s) plus patience
    report, got = await sweep_a_row_produced_ago(redis, tmp_path, spec, group, 400)
    assert report.patient_lanes == ()
    assert report.replayed == 0
    assert got is not None
    assert (got.state, got.replay_count) == (RowState.PRODUCED, 0)


async def test_a_row_past_its_debounce_window_and_patience_is_replayed(
    tmp_path: Path, redis: Transport, unique: str
) -> None:
    """Past the lane's max_wait_s plus patience a calm debounced lane's row is replayed."""
    spec, group = await debounced_lane(redis, tmp_path, unique, "quiet_s: 600\n  max_wait_s: 1800")
    report, got = await sweep_a_row_produced_ago(redis, tmp_path, spec, group, 2110)
    assert report.replayed == 1
    assert got is not None
    assert got.replay_count == 1


async def test_a_backed_up_debounced_lane_waits_past_max_patience(
    tmp_path: Path, redis: Transport, unique: str
) -> None:
    """A backed-up debounced lane's window counts in its overdue bound past max_patience_s."""
    spec, group = await debounced_lane(
        redis, tmp_path, unique, "quiet_s: 1200", backed_up=True
    )  # max_wait_s is then quiet_s: 1200 s
    report, got = await sweep_a_row_produced_ago(redis, tmp_path, spec, group, 1000)
    assert report.patient_lanes == (spec.lane,)
    assert report.replayed == 0
    assert got is not None
    assert got.replay_count == 0
    (tmp_path / "later").mkdir()
    report, _ = await sweep_a_row_produced_ago(redis, tmp_path / "later", spec, group, 1510)
    assert report.replayed == 1
