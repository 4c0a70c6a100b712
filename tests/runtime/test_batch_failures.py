"""Batch lanes under failure: retried copies keep their SLA, promotion shares, held work waits."""

from __future__ import annotations

import asyncio
import time

from runtime.helpers import FAST, declare, eventually, lane_spec, running

from pipeline import headers as h
from pipeline.envelope import Message, Record
from pipeline.retry.router import RetryRouter
from pipeline.runtime import App, Context
from pipeline.runtime.batch import BatchGate
from pipeline.runtime.member import Member
from pipeline.topics.spec import BatchPolicy
from pipeline.transport.protocol import Transport

POLICY = BatchPolicy.model_validate({"idle_below": 0.5, "sla": "10s", "promote_at": 0.5})
_MINUTE_MS = 60_000


def _msg(offset: int, produced_ms: int, headers: dict[str, bytes] | None = None) -> Message:
    return Message("bulk", 0, offset, b"k%d" % offset, b"", headers or {}, produced_ms)


def _copy(offset: int, copied_ms: int, first_produced_ms: int) -> Message:
    """A retry-tier copy written at ``copied_ms`` of an event first produced earlier."""
    headers = {h.DUE_MS: str(copied_ms).encode(), h.PRODUCED_AT_MS: str(first_produced_ms).encode()}
    return Message("bulk.retry.1s", 0, offset, b"k%d" % offset, b"", headers, copied_ms)


def test_a_retry_copy_is_promoted_by_its_first_production() -> None:
    """A copy whose event waited past promote_at starts at once, though the member is busy."""
    started: list[int] = []
    gate: BatchGate[Message] = BatchGate(
        lambda m: started.append(m.offset), lambda: (4, 4), clock_ms=lambda: 20_000
    )
    gate.offer(_copy(7, copied_ms=19_900, first_produced_ms=14_000), "bulk", POLICY)
    assert started == [7]
    assert gate.promoted == 1


def test_a_retry_copy_is_not_held_behind_younger_batch_work() -> None:
    """Fresh work waiting at the head does not hold back an older event's copy, nor its order."""
    now = [20_000]
    started: list[int] = []
    gate: BatchGate[Message] = BatchGate(
        lambda m: started.append(m.offset), lambda: (4, 4), clock_ms=lambda: now[0]
    )
    gate.offer(_msg(1, produced_ms=19_000), "bulk", POLICY)  # 1 s old: waits for 4 s more
    gate.offer(_copy(2, copied_ms=19_500, first_produced_ms=16_000), "bulk", POLICY)
    gate.offer(_copy(3, copied_ms=19_600, first_produced_ms=16_500), "bulk", POLICY)
    assert started == []  # each 4 s old or less: below promote_at (5 s)
    now[0] = 21_000
    gate.pump()
    assert started == [2]  # 5 s since its event was produced; the head is 2 s old
    now[0] = 24_000
    gate.pump()
    assert started == [2, 3, 1]
    assert gate.waiting == 0


def test_retry_copies_start_before_fresh_work_in_their_order_when_idle() -> None:
    """With idle capacity, due copies go first (their tier's delay was their wait), in order."""
    load = [4, 4]
    started: list[int] = []

    def start(m: Message) -> None:
        started.append(m.offset)

    gate: BatchGate[Message] = BatchGate(start, lambda: (load[0], load[1]), clock_ms=lambda: 20_000)
    gate.offer(_msg(1, produced_ms=19_000), "bulk", POLICY)
    gate.offer(_copy(2, copied_ms=19_500, first_produced_ms=19_000), "bulk", POLICY)
    gate.offer(_copy(3, copied_ms=19_600, first_produced_ms=19_000), "bulk", POLICY)
    load[0] = 0
    gate.pump()
    assert started == [2, 3, 1]


def test_a_redriven_message_is_judged_by_its_own_production() -> None:
    """A redriven dead letter keeps pl-produced-at-ms but no due time: it is new work."""
    started: list[int] = []
    gate: BatchGate[Message] = BatchGate(
        lambda m: started.append(m.offset), lambda: (4, 4), clock_ms=lambda: 20_000
    )
    old = {h.PRODUCED_AT_MS: b"1000"}
    gate.offer(_msg(5, produced_ms=19_000, headers=old), "bulk", POLICY)
    assert started == []
    assert gate.waiting == 1


async def test_a_failed_batch_message_is_retried_within_its_sla_while_the_member_is_busy(
    transport: Transport, unique: str
) -> None:
    """Its copy is promoted by the event's first production: the SLA clock does not restart.

    The event was produced 40 minutes ago on a lane of 1 h SLA promoted at half of it: it
    waited, was promoted, failed, and the router wrote its copy to the tier. Interactive work
    fills the member the whole time; the copy must still run as soon as its tier's delay is
    over, not wait another 30 minutes of its own.
    """
    inter = lane_spec(f"inter_{unique}", 1, ordered=False)
    bulk = lane_spec(
        f"bulk_{unique}",
        1,
        ordered=False,
        retry={"tiers": ["200ms"], "max_attempts": 3},
        batch={"idle_below": 0.5, "sla": "1h", "promote_at": 0.5},
    )
    await declare(transport, inter, bulk)
    app = App([inter, bulk])
    release = asyncio.Event()
    ran: list[bytes] = []

    @app.handler(inter.lane)
    async def interactive(event: Message, ctx: Context) -> None:
        await release.wait()

    @app.handler(bulk.lane)
    async def batch(event: Message, ctx: Context) -> None:
        ran.append(event.value)

    member = Member(app, transport, f"g-{unique}", FAST.model_copy(update={"max_concurrency": 4}))
    producer = transport.producer()
    try:
        async with running(member):
            await producer.send_many(inter.name, [Record(b"i%d" % i, None) for i in range(3)])
            await eventually(lambda: member._chain.lanes.running == 3)
            now_ms = int(time.time() * 1000)
            first = Message(bulk.name, 0, 0, b"k", b"copy", timestamp_ms=now_ms - 40 * _MINUTE_MS)
            router = RetryRouter(producer)
            await router.retry(app.lanes[bulk.lane].routes, first, 1, RuntimeError("flaky"))
            await eventually(lambda: ran == [b"copy"], timeout_s=20)
            assert member._chain.lanes.running >= 3  # the interactive work still holds its slots
            assert member.batch_waiting == 0
    finally:
        release.set()
        await producer.close()


async def test_promoted_batch_work_does_not_crowd_out_interactive_work(
    transport: Transport, unique: str
) -> None:
    """A promoted backlog takes turns with interactive work instead of queueing ahead of it all.

    Two interactive runs hold both slots while 20 batch messages pass their promotion point;
    an interactive message read next must run before most of the batch backlog.
    """
    inter = lane_spec(f"inter_{unique}", 1, ordered=False)
    bulk = lane_spec(f"bulk_{unique}", 1, ordered=False, batch={"sla": "2s", "promote_at": 0.25})
    await declare(transport, inter, bulk)
    app = App([inter, bulk])
    release = asyncio.Event()
    order: list[bytes] = []

    @app.handler(inter.lane)
    async def interactive(event: Message, ctx: Context) -> None:
        if event.value.startswith(b"hold"):
            await release.wait()
        order.append(event.value)

    @app.handler(bulk.lane)
    async def batch(event: Message, ctx: Context) -> None:
        order.append(event.value)

    member = Member(app, transport, f"g-{unique}", FAST.model_copy(update={"max_concurrency": 2}))
    gate = member._chain.batch
    producer = transport.producer()
    try:
        async with running(member):
            await producer.send_many(inter.name, [Record(b"hold%d" % i, None) for i in range(2)])
            await eventually(lambda: member._chain.lanes.running == 2)
            await producer.send_many(bulk.name, [Record(b"b%d" % i, None) for i in range(20)])
            sent_ms = time.time() * 1000
            await eventually(lambda: gate.waiting + gate.started == 20)  # all read
            # Every one of them is past its promotion point (0.5 s) and the gate looked again.
            await eventually(lambda: gate.started >= 2 and time.time() * 1000 - sent_ms > 600)
            await producer.send_many(inter.name, [Record(b"interactive", None)])
            await eventually(lambda: member._chain.lanes.buffered == 2 + gate.started + 1)
            release.set()
            await eventually(lambda: len(order) == 23)
    finally:
        release.set()
        await producer.close()
    ran = [value for value in order if not value.startswith(b"hold")]
    assert ran.index(b"interactive") <= 2, ran  # behind one limit's promoted work, not all 20


async def test_held_batch_messages_stay_uncommitted_and_go_to_the_next_member(
    transport: Transport, unique: str
) -> None:
    """What a busy member holds back is never committed: a member stopped at once loses none."""
    inter = lane_spec(f"inter_{unique}", 1, ordered=False)
    bulk = lane_spec(f"bulk_{unique}", 1, ordered=False, batch={"sla": "1h"})
    await declare(transport, inter, bulk)
    app = App([inter, bulk])
    release = asyncio.Event()
    ran: list[bytes] = []

    @app.handler(inter.lane)
    async def interactive(event: Message, ctx: Context) -> None:
        await release.wait()

    @app.handler(bulk.lane)
    async def batch(event: Message, ctx: Context) -> None:
        ran.append(event.value)

    settings = FAST.model_copy(update={"max_concurrency": 4})
    first = Member(app, transport, f"g-{unique}", settings)
    stop, hurry = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(first.run(stop, hurry))
    producer = transport.producer()
    try:
        await producer.send_many(inter.name, [Record(b"i%d" % i, None) for i in range(3)])
        await eventually(lambda: first._chain.lanes.running == 3)
        await producer.send_many(bulk.name, [Record(b"b%d" % i, None) for i in range(5)])
        await eventually(lambda: first.batch_waiting == 5)
        ticks = first._ticks
        await eventually(lambda: first._ticks >= ticks + 3)  # three commits while they wait
        held = [p for tp, p in first._committed.items() if tp.topic == bulk.name]
        assert all(p.offset == 0 for p in held), held
        stop.set()
        hurry.set()  # the interactive runs are cancelled: nothing of it all is finished
        await asyncio.wait_for(task, 60)
        assert ran == []
        release.set()
        async with running(Member(app, transport, f"g-{unique}", settings)) as second:
            await eventually(lambda: second.stats.handled == 8)
        assert sorted(ran) == [b"b%d" % i for i in range(5)]
    finally:
        release.set()
        stop.set()
        await asyncio.wait_for(task, 60)
        await producer.close()
