"""Batch lanes run on idle capacity only, yield to interactive work and are promoted near SLA."""

from __future__ import annotations

import asyncio

from runtime.helpers import FAST, declare, eventually, lane_spec, running

from pipeline.envelope import Message, Record
from pipeline.runtime import App, Context
from pipeline.runtime.batch import BatchGate
from pipeline.runtime.member import Member
from pipeline.topics.spec import BatchPolicy
from pipeline.transport.protocol import Transport

POLICY = BatchPolicy.model_validate({"idle_below": 0.5, "sla": "10s", "promote_at": 0.5})


def _msg(offset: int, produced_ms: int, partition: int = 0) -> Message:
    return Message("bulk", partition, offset, b"k", b"", timestamp_ms=produced_ms)


def test_batch_work_starts_only_below_the_idle_threshold_in_order() -> None:
    """With the member half busy nothing starts; as it empties the heads start in order."""
    started: list[int] = []
    load = [2, 4]  # in use or queued, limit

    def start(m: Message) -> None:
        started.append(m.offset)
        load[0] += 1

    gate = BatchGate(start, lambda: (load[0], load[1]), clock_ms=lambda: 1_000)
    for i in range(3):
        gate.offer(_msg(i, produced_ms=1_000), "bulk", POLICY)
    assert started == []
    assert gate.waiting == 3
    load[0] = 0  # the interactive work finished
    gate.pump()
    assert started == [0, 1]  # 0 and 1 in use: half of 4 is the idle threshold
    load[0] = 0
    gate.pump()
    assert started == [0, 1, 2]
    assert gate.waiting == 0
    assert gate.promoted == 0


def test_waiting_batch_work_is_promoted_at_its_share_of_the_sla() -> None:
    """Past promote_at of the SLA a message starts whatever the load (here: fully busy)."""
    now = [0]
    started: list[int] = []
    gate = BatchGate(lambda m: started.append(m.offset), lambda: (4, 4), clock_ms=lambda: now[0])
    gate.offer(_msg(0, produced_ms=0), "bulk", POLICY)
    gate.offer(_msg(1, produced_ms=3_000), "bulk", POLICY)
    now[0] = 4_999
    gate.pump()
    assert started == []
    now[0] = 5_000  # half of the 10 s SLA since the first was produced
    gate.pump()
    assert started == [0]
    now[0] = 8_000
    gate.pump()
    assert started == [0, 1]
    assert gate.promoted == 2


def test_revoked_partitions_lose_their_held_messages() -> None:
    """A revoked partition's held batch messages are dropped (its next owner reads them)."""
    gate = BatchGate(lambda _m: None, lambda: (9, 4), clock_ms=lambda: 0)
    gate.offer(_msg(0, 0, partition=0), "bulk", POLICY)
    gate.offer(_msg(1, 0, partition=1), "bulk", POLICY)
    dropped = gate.drop([_msg(0, 0, partition=1).tp])
    assert [m.offset for m in dropped] == [1]
    assert gate.waiting == 1


async def test_batch_lane_yields_to_interactive_work_on_a_real_broker(
    transport: Transport, unique: str
) -> None:
    """While interactive work fills the member, batch messages wait; then they all run."""
    inter = lane_spec(f"inter_{unique}", 1, ordered=False)
    bulk = lane_spec(f"bulk_{unique}", 1, ordered=False, batch={"idle_below": 0.5, "sla": "1h"})
    await declare(transport, inter, bulk)
    app = App([inter, bulk])
    release = asyncio.Event()
    done: list[str] = []

    @app.handler(inter.lane)
    async def interactive(event: Message, ctx: Context) -> None:
        await release.wait()
        done.append("inter")

    @app.handler(bulk.lane)
    async def batch(event: Message, ctx: Context) -> None:
        done.append("bulk")

    settings = FAST.model_copy(update={"max_concurrency": 4})
    member = Member(app, transport, f"g-{unique}", settings)
    producer = transport.producer()
    async with running(member):
        await producer.send_many(inter.name, [Record(b"i%d" % i, None) for i in range(3)])
        await eventually(lambda: member.stats.handled == 0 and _running(member) == 3)
        await producer.send_many(bulk.name, [Record(b"b%d" % i, None) for i in range(5)])
        await eventually(lambda: member.batch_waiting == 5)
        assert done == []  # 3 of 4 slots busy: above the idle threshold, nothing batch ran
        release.set()
        await eventually(lambda: member.stats.handled == 8)
    await producer.close()
    assert done[:3] == ["inter"] * 3


async def test_batch_work_near_its_sla_runs_even_when_the_member_is_busy(
    transport: Transport, unique: str
) -> None:
    """Promotion: a batch message past promote_at of its SLA does not wait for idle capacity."""
    inter = lane_spec(f"inter_{unique}", 1, ordered=False)
    bulk = lane_spec(f"bulk_{unique}", 1, ordered=False, batch={"sla": "2s", "promote_at": 0.25})
    await declare(transport, inter, bulk)
    app = App([inter, bulk])
    release = asyncio.Event()

    @app.handler(inter.lane)
    async def interactive(event: Message, ctx: Context) -> None:
        await release.wait()

    @app.handler(bulk.lane)
    async def batch(event: Message, ctx: Context) -> None:
        pass

    settings = FAST.model_copy(update={"max_concurrency": 4})
    member = Member(app, transport, f"g-{unique}", settings)
    producer = transport.producer()
    try:
        async with running(member):
            await producer.send_many(inter.name, [Record(b"i%d" % i, None) for i in range(3)])
            await eventually(lambda: _running(member) == 3)
            await producer.send_many(bulk.name, [Record(b"b%d" % i, None) for i in range(2)])
            await eventually(lambda: member.stats.handled == 2)  # promoted after 0.5 s
            assert member.stats.handled == 2  # the interactive ones still hold their slots
            release.set()
            await eventually(lambda: member.stats.handled == 5)
    finally:
        release.set()
        await producer.close()


def _running(member: Member) -> int:
    return member._chain.lanes.running
