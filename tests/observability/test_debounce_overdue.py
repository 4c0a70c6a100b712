"""How long a debounced lane's earliest turn has been due, read from a real Redis."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis
from support import test_settings

from pipeline.admission.debounce import Debouncer
from pipeline.admission.debounce import keys as debounce_keys
from pipeline.envelope import Message
from pipeline.observability.facades import DebounceMetrics
from pipeline.observability.metrics import Metrics
from pipeline.observability.sources import DebounceOverdueSource
from pipeline.observability.wiring import debounce_sources, member_telemetry
from pipeline.topics.spec import DebouncePolicy, TopicSpec
from pipeline.transport import create_transport

pytestmark = pytest.mark.redis
PREFIX = "pltest"
OVERDUE = "pipeline_debounce_overdue_seconds"


@pytest.fixture
async def lane(redis: Redis, unique: str) -> AsyncIterator[str]:
    """A lane name no other test uses; its keys are deleted afterwards (buffers never expire)."""
    name = f"deb_overdue_{unique}"
    yield name
    async for key in redis.scan_iter(match=f"{debounce_keys.lane_tag(PREFIX, name)}*"):
        await redis.delete(key)


def message(offset: int) -> Message:
    """A consumed message of conversation ``c1``."""
    return Message("ai_turns", 0, offset, b"c1", f"m{offset}".encode(), {}, 1_000 + offset)


def debouncer(redis: Redis, lane: str) -> Debouncer:
    """A debouncer of ``lane`` whose turns are due at once (one message fills the buffer)."""
    policy = DebouncePolicy(key="conversation_id", quiet_s=4, max_wait_s=30, max_batch=1)
    return Debouncer(redis, PREFIX, lane, policy)


def spec(name: str, **declared: object) -> TopicSpec:
    """A topic ``name`` with ``declared`` fields."""
    return TopicSpec.model_validate({"name": name, "partitions": 1, **declared})


async def test_a_turn_no_runner_claims_reads_as_overdue_until_it_runs(redis, lane):
    """A turn no runner claims reads 0 before its due time, 700 s at 700 s past it, 0 once run."""
    deb = debouncer(redis, lane)
    due_ms = await deb.record("c1", message(1))
    other = f"{lane}_idle"  # a debounced lane with nothing buffered
    now_s = (due_ms - 1_000) / 1000
    metrics = Metrics()
    value = metrics.registry.get_sample_value
    source = DebounceOverdueSource(
        redis, PREFIX, [lane, other], DebounceMetrics(metrics), clock=lambda: now_s
    )
    await source.refresh()
    assert value(OVERDUE, {"lane": lane}) == 0  # not due yet
    assert value(OVERDUE, {"lane": other}) == 0

    now_s = (due_ms + 700_000) / 1000  # the lane's members died: nothing claims it
    await source.refresh()
    assert value(OVERDUE, {"lane": lane}) == pytest.approx(700.0)
    assert value(OVERDUE, {"lane": other}) == 0

    claim = await deb.claim(10)  # a member came back and ran the turn
    (turn,) = claim.turns
    assert await deb.finish(turn, ok=True) == "done"
    await source.refresh()
    assert value(OVERDUE, {"lane": lane}) == 0


async def test_the_overdue_age_is_measured_on_redis_clock(redis, lane):
    """Without a clock given, a turn due at once reads its age by Redis TIME, never negative."""
    due_ms = await debouncer(redis, lane).record("c1", message(1))
    metrics = Metrics()
    debounced = spec(lane, debounce={"key": "conversation_id", "quiet_s": 4})
    (source,) = debounce_sources(metrics, redis, PREFIX, [debounced, spec("messages")])
    await source.refresh()
    seconds, micros = await redis.time()
    after_ms = seconds * 1000 + micros // 1000
    overdue_s = metrics.registry.get_sample_value(OVERDUE, {"lane": lane})
    assert overdue_s is not None
    assert 0 <= overdue_s <= (after_ms - due_ms) / 1000


def test_lanes_without_debounce_get_no_source(redis):
    """A process whose lanes are not debounced reads nothing from Redis for this gauge."""
    assert debounce_sources(Metrics(), redis, PREFIX, [spec("messages")]) == []


async def test_a_member_given_its_redis_reports_its_debounced_lanes(redis, lane):
    """A member's telemetry, given its Redis, refreshes the gauge of its debounced lanes."""
    due_ms = await debouncer(redis, lane).record("c1", message(1))
    transport = create_transport(test_settings(transport="redis"))
    try:
        debounced = spec(lane, debounce={"key": "conversation_id", "quiet_s": 4})
        telemetry = member_telemetry(
            transport.admin(), [debounced], lane, redis=redis, redis_prefix=PREFIX
        )
        (source,) = [s for s in telemetry.server.sources if s.name == "debounce_overdue"]
        await source.refresh()
        seconds, micros = await redis.time()
        overdue_s = telemetry.metrics.registry.get_sample_value(OVERDUE, {"lane": lane})
        assert overdue_s is not None
        assert 0 <= overdue_s <= (seconds * 1000 + micros // 1000 - due_ms) / 1000
    finally:
        await transport.close()
