"""The sweeper on a real log store and Redis: produce the lost, be patient, abandon loudly."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import httpx
import pytest
from contract.helpers import consume_until, expire_below, make_topic
from ingress.helpers import META, serve_until_listening, write_sources, write_topics
from logstore.helpers import FakeClock, new_row

from pipeline.config import IngressSettings, Settings, SweeperSettings
from pipeline.envelope import Delivered, Message, Record, TopicPartition
from pipeline.errors import TransportError
from pipeline.ingress import headers as h
from pipeline.ingress.backlog import GroupLagBacklog
from pipeline.ingress.sweeper import Sweeper, SweepReport
from pipeline.logstore import RowState, Selection
from pipeline.logstore.sqlite import SqliteLogStore
from pipeline.observability.metrics import Metrics
from pipeline.observability.wiring import sweeper_heartbeat
from pipeline.transport import create_transport
from pipeline.transport.protocol import Producer, Transport

SETTINGS = SweeperSettings(
    unproduced_after_s=60, patience_s=300, max_patience_s=900, max_replays=2, lease_s=30
)


@pytest.fixture
async def redis(settings: Settings, redis_service: str) -> AsyncIterator[Transport]:
    """The real Redis Streams transport."""
    transport = create_transport(settings, "redis")
    yield transport
    await transport.close()


@pytest.fixture
async def store(tmp_path: Path, clock: FakeClock) -> AsyncIterator[SqliteLogStore]:
    """A real SQLite log store on the fake clock."""
    sqlite = SqliteLogStore(tmp_path / "log.db", clock=clock)
    await sqlite.open()
    yield sqlite
    await sqlite.close()


@pytest.fixture
def clock() -> FakeClock:
    """A clock the test moves by hand."""
    return FakeClock()


async def drain(transport: Transport, topic: str, group: str, count: int) -> list[Message]:
    """Consume exactly ``count`` messages of ``topic`` as ``group``, committing them."""
    consumer = transport.consumer(group, [topic])
    got = await consume_until(consumer, lambda r: len(r) >= count)
    await consumer.close()
    return got


async def test_rows_never_produced_are_produced_after_the_delay(
    store: SqliteLogStore, redis: Transport, clock: FakeClock, unique: str
) -> None:
    """Rows left received (the ingress died) are produced once older than the delay, no sooner."""
    topic = f"messages-{unique}"
    await make_topic(redis, topic, 2)
    old = [new_row(n, clock, topic=topic, lane="messages") for n in range(5)]
    for row in old:
        await store.insert(row)
    clock.advance(61)
    fresh = new_row(99, clock, topic=topic, lane="messages")
    await store.insert(fresh)
    backlog = GroupLagBacklog(redis.admin(), {"messages": [topic]}, {})
    sweeper = Sweeper(
        store, redis.producer(), backlog, {"messages": [topic]}, SETTINGS, clock=clock
    )
    report = await sweeper.sweep_once()
    assert (report.produced, report.replayed, report.abandoned) == (5, 0, 0)
    got = await drain(redis, topic, f"g-{unique}", 5)
    assert sorted(m.headers[h.EVENT_ID].decode() for m in got) == [f"ev-{n}" for n in range(5)]
    assert {m.headers[h.REPLAY_COUNT] for m in got} == {b"0"}
    assert await store.count_by_state(Selection()) == {
        RowState.PRODUCED: 5,
        RowState.RECEIVED: 1,
    }
    assert (await sweeper.sweep_once()).produced == 0


async def test_replay_waits_while_the_lane_is_backed_up(
    store: SqliteLogStore, redis: Transport, clock: FakeClock, unique: str
) -> None:
    """Past patience a backed-up lane's rows wait, a calm lane's are replayed; past max, all are."""
    busy, calm = f"messages-{unique}", f"engagement-{unique}"
    for topic in (busy, calm):
        await make_topic(redis, topic, 1)
    lanes = {"messages": [busy], "engagement": [calm]}
    groups = {"messages": f"busy-{unique}", "engagement": f"calm-{unique}"}
    # The busy lane's group has a message it has not consumed: a backlog of one.
    await redis.producer().send(busy, b"ahead of the replay", key=b"k")
    waiting = new_row(1, clock, topic=busy, lane="messages")
    idle = new_row(2, clock, topic=calm, lane="engagement")
    for row in (waiting, idle):
        await store.insert(row)
    await store.mark_produced([waiting.id, idle.id])
    backlog = GroupLagBacklog(redis.admin(), lanes, groups)
    sweeper = Sweeper(store, redis.producer(), backlog, lanes, SETTINGS, clock=clock)

    clock.advance(301)
    report = await sweeper.sweep_once()
    assert report.patient_lanes == ("messages",)
    assert report.replayed == 1
    calm_events = await drain(redis, calm, groups["engagement"], 1)
    assert calm_events[0].headers[h.EVENT_ID] == b"ev-2"
    assert calm_events[0].headers[h.REPLAY_COUNT] == b"1"
    await store.mark_processed([idle.id])  # its consumer handled the replay
    got = await store.get(waiting.id)
    assert got is not None
    assert got.replay_count == 0

    clock.advance(600)  # 901 s after production: past the maximum patience
    report = await sweeper.sweep_once()
    assert report.patient_lanes == ("messages",)
    assert report.replayed == 1
    busy_events = await drain(redis, busy, groups["messages"], 2)
    assert [m.headers.get(h.REPLAY_COUNT) for m in busy_events] == [None, b"1"]


async def test_rows_past_the_replay_limit_are_abandoned_loudly(
    store: SqliteLogStore,
    redis: Transport,
    clock: FakeClock,
    unique: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """After max_replays replays unprocessed, a row is abandoned, logged CRITICAL and counted."""
    topic = f"messages-{unique}"
    await make_topic(redis, topic, 1)
    poison, fine = (new_row(n, clock, topic=topic, lane="messages") for n in (1, 2))
    for row in (poison, fine):
        await store.insert(row)
    await store.mark_produced([poison.id, fine.id])
    await store.mark_processed([fine.id])
    lanes = {"messages": [topic]}
    backlog = GroupLagBacklog(redis.admin(), lanes, {"messages": f"g-{unique}"})
    sweeper = Sweeper(store, redis.producer(), backlog, lanes, SETTINGS, clock=clock)
    counts = []
    with caplog.at_level(logging.CRITICAL, logger="pipeline.ingress.sweeper"):
        for _ in range(3):
            clock.advance(1_000)
            report = await sweeper.sweep_once()
            counts.append((report.replayed, report.abandoned))
    assert counts == [(1, 0), (1, 0), (0, 1)]
    assert sweeper.totals.abandoned == 1
    got = await store.get(poison.id)
    assert got is not None
    assert (got.state, got.replay_count) == (RowState.ABANDONED, 2)
    assert got.last_error == "abandoned after 2 replays without being processed"
    critical = [r for r in caplog.records if r.levelno == logging.CRITICAL]
    assert len(critical) == 1
    assert "abandoned after 2 replays" in critical[0].getMessage()
    assert critical[0].__dict__["row_id"] == poison.id
    clock.advance(1_000)
    assert (await sweeper.sweep_once()).abandoned == 0  # abandoned is terminal


async def test_a_lane_without_a_known_group_counts_as_backed_up(
    redis: Transport, unique: str
) -> None:
    """With no consumer group configured the sweeper is patient (replays only when overdue)."""
    backlog = GroupLagBacklog(redis.admin(), {"messages": [f"t-{unique}"]}, {})
    assert await backlog.is_backlogged("messages") is True


async def test_a_caught_up_group_is_not_a_backlog(redis: Transport, unique: str) -> None:
    """A lane whose group has consumed everything has no backlog."""
    topic = f"t-{unique}"
    await make_topic(redis, topic, 1)
    await redis.producer().send(topic, b"x")
    backlog = GroupLagBacklog(redis.admin(), {"messages": [topic]}, {"messages": f"g-{unique}"})
    assert await backlog.is_backlogged("messages") is True
    await drain(redis, topic, f"g-{unique}", 1)
    assert await backlog.is_backlogged("messages") is False


async def test_a_sweeper_looping_on_its_own_serves_its_heartbeat(
    tmp_path: Path, settings: Settings, redis: Transport, unique: str
) -> None:
    """``pipeline sweep --loop`` with a metrics port shows when it last swept.

    It served no metrics: with the ingress's sweeper off and this loop sweeping,
    ``PipelineSweeperSilent`` paged although sweeps happened. It refreshes them every
    ``ingress.metrics_interval_s`` (it used 15 s whatever that setting said).
    """
    topic = f"messages-{unique}"
    await make_topic(redis, topic, 2)
    write_topics(tmp_path / "topics", {topic: "messages"})
    with socket.socket() as probe:  # a port free now, for the sweeper to take
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIPELINE_")}
    env |= {
        "PIPELINE_TRANSPORT": "redis",
        "PIPELINE_REDIS__URL": settings.redis.url,
        "PIPELINE_TOPICS_DIR": str(tmp_path / "topics"),
        "PIPELINE_INGRESS__SQLITE_PATH": str(tmp_path / "ingress.db"),
        "PIPELINE_INGRESS__SWEEPER__INTERVAL_S": "0.2",
        "PIPELINE_INGRESS__METRICS_PORT": str(port),
        "PIPELINE_INGRESS__METRICS_INTERVAL_S": "0.2",
    }
    proc = subprocess.Popen(  # noqa: ASYNC220 - the sweeper runs beside this test's loop
        [Path(sys.executable).with_name("pipeline"), "sweep", "--loop"],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    refreshed = "pipeline_metrics_refresh_timestamp_seconds "
    stamps: list[float] = []
    swept = 0.0
    try:
        deadline = time.monotonic() + 60
        async with httpx.AsyncClient() as http:
            while len(stamps) < 3 or swept <= 0:
                assert proc.poll() is None, proc.communicate()[1]
                assert time.monotonic() < deadline, f"swept {swept}, refreshes seen: {stamps}"
                with contextlib.suppress(httpx.TransportError):  # not listening yet
                    text = (await http.get(f"http://127.0.0.1:{port}/metrics")).text
                    stamp = _gauge(text, refreshed)
                    if stamp > 0 and (not stamps or stamp != stamps[-1]):
                        stamps.append(stamp)
                    swept = _gauge(text, "pipeline_sweeper_last_run_timestamp_seconds ")
                await asyncio.sleep(0.05)
        assert swept > time.time() - 60
    finally:
        proc.terminate()
        proc.communicate(timeout=30)
    # Two successive refreshes, timed by the loop itself: the interval set, not the default.
    assert stamps[2] - stamps[1] < IngressSettings().metrics_interval_s / 2, stamps


async def test_an_ingress_refreshes_its_metrics_every_metrics_interval(
    tmp_path: Path,
    settings: Settings,
    redis: Transport,
    unique: str,
    started: list[subprocess.Popen[str]],
) -> None:
    """``ingress serve`` refreshes ``/metrics`` every ``ingress.metrics_interval_s``, not 15 s."""
    topic = f"messages-{unique}"
    await make_topic(redis, topic, 2)
    write_topics(tmp_path / "topics", {topic: "messages"})
    source = {**META, "secrets": ["env:PIPELINE_TEST_METRICS_SECRET"], "topic": topic, "routes": []}
    write_sources(tmp_path / "sources.yaml", {"whatsapp": source})
    with socket.socket() as probe:  # a port free now, for the ingress's metrics
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIPELINE_")}
    env |= {
        "PIPELINE_TEST_METRICS_SECRET": "metrics-interval-secret",
        "PIPELINE_TRANSPORT": "redis",
        "PIPELINE_REDIS__URL": settings.redis.url,
        "PIPELINE_TOPICS_DIR": str(tmp_path / "topics"),
        "PIPELINE_INGRESS__SOURCES_FILE": str(tmp_path / "sources.yaml"),
        "PIPELINE_INGRESS__SQLITE_PATH": str(tmp_path / "ingress.db"),
        "PIPELINE_INGRESS__SWEEPER__INTERVAL_S": "0.2",
        "PIPELINE_INGRESS__METRICS_PORT": str(port),
        "PIPELINE_INGRESS__METRICS_INTERVAL_S": "0.2",
    }
    proc, _ = serve_until_listening(env, started)
    refreshed = "pipeline_metrics_refresh_timestamp_seconds "
    stamps: list[float] = []
    swept = 0.0
    try:
        deadline = time.monotonic() + 60
        async with httpx.AsyncClient() as http:
            while len(stamps) < 3 or swept <= 0:
                assert proc.poll() is None, proc.communicate()[1]
                assert time.monotonic() < deadline, f"refreshes seen: {stamps}"
                text = (await http.get(f"http://127.0.0.1:{port}/metrics")).text
                stamp = _gauge(text, refreshed)
                if stamp > 0 and (not stamps or stamp != stamps[-1]):
                    stamps.append(stamp)
                swept = _gauge(text, "pipeline_sweeper_last_run_timestamp_seconds ")
                await asyncio.sleep(0.05)
    finally:
        proc.terminate()
        proc.communicate(timeout=60)
    # Two successive refreshes, timed by the ingress itself: the interval set, not the default.
    assert stamps[2] - stamps[1] < IngressSettings().metrics_interval_s / 2, stamps


def _gauge(text: str, prefix: str) -> float:
    """The value of the exposition line starting with ``prefix`` (0 when there is none)."""
    lines = [line for line in text.splitlines() if line.startswith(prefix)]
    return float(lines[0].removeprefix(prefix)) if lines else 0.0


class _Unreachable:
    """A backlog reading whose group lag fails, as with the broker gone after the first phase."""

    async def is_backlogged(self, lane: str) -> bool:
        """The broker does not answer."""
        raise TransportError(f"lag of {lane!r}: broker unavailable")


async def test_a_sweep_that_fails_part_way_counts_the_rows_it_produced(
    store: SqliteLogStore, redis: Transport, clock: FakeClock, unique: str
) -> None:
    """Five rows produced, then the replay phase fails: they count, the run is not stamped.

    Before, the report of a sweep that raised was dropped: rows it had produced were in neither
    the totals nor ``pipeline_sweeper_rows_total``. Its last-run time stays behind, so a sweeper
    that keeps failing still raises the staleness alert.
    """
    topic = f"messages-{unique}"
    await make_topic(redis, topic, 1)
    for n in range(5):
        await store.insert(new_row(n, clock, topic=topic, lane="messages"))
    clock.advance(61)
    metrics = Metrics()
    sweeper = Sweeper(
        store,
        redis.producer(),
        _Unreachable(),
        {"messages": [topic]},
        SETTINGS,
        clock=clock,
        on_sweep=sweeper_heartbeat(metrics),
    )
    with pytest.raises(TransportError, match="broker unavailable"):
        await sweeper.sweep_once()
    assert sweeper.totals.produced == 5
    rows = metrics.registry.get_sample_value("pipeline_sweeper_rows_total", {"action": "produced"})
    assert rows == 5
    stamped = metrics.registry.get_sample_value("pipeline_sweeper_last_run_timestamp_seconds")
    assert stamped == 0  # never stamped
    await drain(redis, topic, f"g-{unique}", 5)


async def test_a_failing_sweep_loop_logs_one_line_and_carries_on(
    store: SqliteLogStore,
    redis: Transport,
    clock: FakeClock,
    unique: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A sweep that fails with a known error is one warning line with the reason, no traceback.

    Before, each failed sweep of the loop logged the whole traceback of a broker outage.
    """
    topic = f"messages-{unique}"
    await make_topic(redis, topic, 1)
    await store.insert(new_row(0, clock, topic=topic, lane="messages"))
    clock.advance(61)
    sweeper = Sweeper(
        store, redis.producer(), _Unreachable(), {"messages": [topic]}, SETTINGS, clock=clock
    )
    stop = asyncio.Event()
    sweeper.on_sweep = lambda report: stop.set() if not report.finished else None
    with caplog.at_level(logging.WARNING, logger="pipeline.ingress.sweeper"):
        await asyncio.wait_for(sweeper.run(stop), 30)
    (line,) = [r for r in caplog.records if "sweep failed" in r.getMessage()]
    assert "broker unavailable" in line.getMessage()
    assert line.exc_info is None
    await drain(redis, topic, f"g-{unique}", 1)


class _StopsAfterOneBatch:
    """The real producer; the first batch it delivers also asks the sweeper to stop."""

    def __init__(self, producer: Producer, stop: asyncio.Event) -> None:
        """Produce with ``producer``; set ``stop`` once a batch is acknowledged."""
        self._producer = producer
        self._stop = stop
        self.batches = 0

    async def send_many(self, topic: str, records: Sequence[Record]) -> list[Delivered]:
        """Produce ``records``, then set the stop event."""
        delivered = await self._producer.send_many(topic, records)
        self.batches += 1
        self._stop.set()
        return delivered


async def test_a_stopped_sweeper_ends_its_sweep_after_the_batch_in_hand(
    store: SqliteLogStore, redis: Transport, clock: FakeClock, unique: str
) -> None:
    """Stop asked during a sweep: the batch being produced is marked, no further batch is claimed.

    Before, the sweep ran to its end (up to 1,000 batches) before ``run`` returned, so an
    ingress asked to stop while the broker was down waited for every batch's produce timeout.
    """
    topic = f"messages-{unique}"
    await make_topic(redis, topic, 1)
    for n in range(5):
        await store.insert(new_row(n, clock, topic=topic, lane="messages"))
    clock.advance(61)
    stop = asyncio.Event()
    producer = _StopsAfterOneBatch(redis.producer(), stop)
    settings = SETTINGS.model_copy(update={"batch_size": 1})
    sweeper = Sweeper(store, producer, _Unreachable(), {"messages": [topic]}, settings, clock=clock)
    await asyncio.wait_for(sweeper.run(stop), 30)
    assert producer.batches == 1
    assert sweeper.totals.produced == 1
    counts = await store.count_by_state(Selection())
    assert counts == {RowState.PRODUCED: 1, RowState.RECEIVED: 4}
    await drain(redis, topic, f"g-{unique}", 1)


async def test_a_lane_whose_unread_messages_all_expired_is_not_backed_up(
    redis: Transport, settings: Settings, unique: str
) -> None:
    """Messages a group never read that expired or were trimmed are not a backlog to wait for."""
    topic = f"messages-{unique}"
    await make_topic(redis, topic, 1)
    for n in range(3):
        await redis.producer().send(topic, b"gone before anyone read it %d" % n, key=b"k")
    backlog = GroupLagBacklog(redis.admin(), {"messages": [topic]}, {"messages": f"g-{unique}"})
    assert await backlog.is_backlogged("messages")
    await expire_below(redis, settings, TopicPartition(topic, 0), 3)
    assert not await backlog.is_backlogged("messages")


class _FailsOnce:
    """A backlog reading whose first answer is a bug (an error no PipelineError), then none."""

    def __init__(self) -> None:
        self.asked = 0

    async def is_backlogged(self, lane: str) -> bool:
        """Raise ValueError the first time, then say ``lane`` is not backed up."""
        self.asked += 1
        if self.asked == 1:
            raise ValueError(f"lag of {lane!r}: a bug")
        return False


async def test_a_sweep_failing_with_an_unexpected_error_is_logged_and_the_loop_goes_on(
    redis: Transport,
    store: SqliteLogStore,
    clock: FakeClock,
    unique: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A sweep raising no PipelineError is logged with its traceback and the next one runs.

    Before, such an error (here the lane's lag reading raising ValueError) ended the sweeper's
    task for good while the ingress stayed healthy and ready; the loop now logs it and sweeps
    again at the next interval.
    """
    topic = f"messages-{unique}"
    await make_topic(redis, topic, 1)
    stop = asyncio.Event()
    reports: list[bool] = []

    def swept(report: SweepReport) -> None:
        reports.append(report.finished)
        if report.finished:
            stop.set()

    sweeper = Sweeper(
        store,
        redis.producer(),
        _FailsOnce(),
        {"messages": [topic]},
        SETTINGS.model_copy(update={"interval_s": 0.01}),
        clock=clock,
        on_sweep=swept,
    )
    with caplog.at_level(logging.WARNING, logger="pipeline.ingress.sweeper"):
        await asyncio.wait_for(sweeper.run(stop), 30)
    assert reports == [False, True]
    (line,) = [r for r in caplog.records if "sweep failed" in r.getMessage()]
    assert "ValueError" in line.getMessage()
    assert line.exc_info is not None
