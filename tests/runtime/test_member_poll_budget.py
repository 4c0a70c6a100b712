"""A Kafka member waiting on running handlers within its group's poll budget (real broker).

The group's rebalance timeout, and librdkafka's own check that the application polls, is
``max.poll.interval.ms``: a member that waits on its handlers for longer, inside a revocation
or during its shutdown's drain, is dropped from the group and loses every partition.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import AsyncIterator
from typing import Literal

import pytest
from runtime.helpers import FAST, declare, eventually, lane_spec

from pipeline.config import Settings
from pipeline.envelope import Record, TopicPartition
from pipeline.runtime import App, Context
from pipeline.runtime.member import Member
from pipeline.transport import create_transport
from pipeline.transport.partitioner import partition_for
from pipeline.transport.protocol import Transport

pytestmark = pytest.mark.usefixtures("kafka_service")
POLL_INTERVAL_MS = 6000  # the session timeout below: the least librdkafka allows
PATIENT = FAST.model_copy(update={"shutdown_grace_s": 30.0})
"""A grace far longer than the poll interval: only the group's budget may bound the waits."""


def short_poll_interval(settings: Settings, protocol: Literal["consumer", "classic"]) -> Transport:
    """A Kafka transport whose members must poll every few seconds."""
    kafka = settings.kafka.model_copy(
        update={
            "group_protocol": protocol,
            "session_timeout_ms": 6000,
            "client": {"max.poll.interval.ms": str(POLL_INTERVAL_MS)},
        }
    )
    return create_transport(settings.model_copy(update={"kafka": kafka}), "kafka")


def one_key_per_partition(partitions: int) -> list[bytes]:
    """A key for each partition of a topic of ``partitions``."""
    keys: dict[int, bytes] = {}
    i = 0
    while len(keys) < partitions:
        key = f"k{i}".encode()
        keys.setdefault(partition_for(key, partitions), key)
        i += 1
    return [keys[p] for p in range(partitions)]


class LeftGroup(logging.Handler):
    """Set once librdkafka says its member exceeded the poll interval and left its group."""

    def __init__(self) -> None:
        """Not set yet; set from librdkafka's threads through the running loop."""
        super().__init__()
        self.left = asyncio.Event()
        self._loop = asyncio.get_running_loop()

    def emit(self, record: logging.LogRecord) -> None:
        """Look for librdkafka's line on leaving the group."""
        if "maximum poll interval" in record.getMessage():
            self._loop.call_soon_threadsafe(self.left.set)


@pytest.fixture
async def left_group() -> AsyncIterator[LeftGroup]:
    """Watches librdkafka's log for a member leaving its group on the poll interval."""
    handler = LeftGroup()
    logger = logging.getLogger("pipeline.librdkafka")
    logger.addHandler(handler)
    yield handler
    logger.removeHandler(handler)


@pytest.mark.parametrize("protocol", ["consumer", "classic"])
async def test_a_revocation_waiting_on_long_handlers_keeps_the_partitions_not_revoked(
    settings: Settings, unique: str, protocol: Literal["consumer", "classic"]
) -> None:
    """A member joining beside one whose handlers outlast the poll interval takes only its share."""
    transport = short_poll_interval(settings, protocol)
    spec = lane_spec(f"budget_{unique}", 4)
    await declare(transport, spec)
    release = asyncio.Event()
    runs: Counter[tuple[int, int]] = Counter()

    def app() -> App:
        made = App([spec])

        @made.handler(spec.lane)
        async def handle(event: bytes, ctx: Context) -> None:
            runs[(ctx.message.partition, ctx.message.offset)] += 1
            await release.wait()

        return made

    producer = transport.producer()
    await producer.send_many(spec.name, [Record(b"v", key) for key in one_key_per_partition(4)])
    await producer.close()
    group = f"g-{unique}"
    first = Member(app(), transport, group, PATIENT)
    revoked: list[tuple[list[TopicPartition], bool]] = []
    on_revoked = first.on_revoked

    async def recording(partitions: list[TopicPartition], *, lost: bool) -> object:
        revoked.append((sorted(partitions), lost))
        return await on_revoked(partitions, lost=lost)

    first.on_revoked = recording  # type: ignore[method-assign]
    stop_first, stop_second = asyncio.Event(), asyncio.Event()
    running_first = asyncio.create_task(first.run(stop_first))
    second = Member(app(), transport, group, PATIENT)
    running_second: asyncio.Task[None] | None = None
    try:
        await eventually(lambda: first._chain.lanes.running == 4)
        running_second = asyncio.create_task(second.run(stop_second))
        await eventually(lambda: len(second.assignment) >= 2)
        release.set()
        lag = transport.admin()

        async def all_committed() -> bool:
            return [p.committed for p in await lag.group_lag(group, spec.name)] == [1] * 4

        deadline = asyncio.get_running_loop().time() + 60
        while not await all_committed():
            assert asyncio.get_running_loop().time() < deadline, runs
            await asyncio.sleep(0.1)
        during = list(revoked)
    finally:
        release.set()
        stop_first.set()
        stop_second.set()
        await asyncio.wait_for(running_first, 60)
        if running_second is not None:
            await asyncio.wait_for(running_second, 60)
        await transport.close()
    assert [(len(tps), lost) for tps, lost in during] == [(2, False)]
    assert sorted(runs.values()) == [1, 1, 2, 2]  # the revoked pair ran again at its next owner


@pytest.mark.parametrize("protocol", ["consumer", "classic"])
async def test_a_shutdown_drain_longer_than_the_poll_interval_keeps_the_partitions(
    settings: Settings, unique: str, protocol: Literal["consumer", "classic"], left_group: LeftGroup
) -> None:
    """A drain outlasting max.poll.interval.ms stays in the group and commits what it finished."""
    transport = short_poll_interval(settings, protocol)
    spec = lane_spec(f"drain_{unique}", 2)
    await declare(transport, spec)
    release = asyncio.Event()
    app = App([spec])
    revoked: list[bool] = []

    @app.handler(spec.lane)
    async def handle(event: bytes, ctx: Context) -> None:
        await release.wait()

    producer = transport.producer()
    await producer.send_many(spec.name, [Record(b"slow", b"a")])
    await producer.close()
    group = f"g-{unique}"
    member = Member(app, transport, group, PATIENT)
    on_revoked = member.on_revoked

    async def recording(partitions: list[TopicPartition], *, lost: bool) -> object:
        revoked.append(lost)
        return await on_revoked(partitions, lost=lost)

    member.on_revoked = recording  # type: ignore[method-assign]
    stop = asyncio.Event()
    task = asyncio.create_task(member.run(stop))
    try:
        await eventually(lambda: member._chain.lanes.running == 1)
        stop.set()  # the drain begins, its handler still running
        # Twice the poll interval: librdkafka leaves the group after one.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(left_group.left.wait(), 2 * POLL_INTERVAL_MS / 1000)
        release.set()
        await asyncio.wait_for(task, 60)
        lag = await transport.admin().group_lag(group, spec.name)
    finally:
        release.set()
        stop.set()
        await asyncio.wait({task}, timeout=60)
        await transport.close()
    assert not left_group.left.is_set()
    assert True not in revoked
    assert sorted(p.committed or 0 for p in lag) == [0, 1]  # the drained run is not run again
