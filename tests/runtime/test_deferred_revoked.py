"""A deferred message dropped with its revoked partition leaves no mark of its deferral.

The admission gate defers a flooding tenant's message through the first retry tier by marking
it (its partition and offset) and queueing it in the key lanes; its run diverts it and ends
the mark. A rebalance that revokes the partition while the message waits there for a worker
drops it unrun (its next owner reads it again), and its mark must go with it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from runtime.helpers import FAST, declare, eventually, lane_spec, produce, running
from support import own_throttle

from pipeline import headers as h
from pipeline.admission.throttle import Throttle
from pipeline.envelope import Message, Position, Record, TopicPartition
from pipeline.runtime import App, Context
from pipeline.runtime.member import Member
from pipeline.transport.protocol import Transport

MESSAGES = 6
"""Messages of one tenant: one runs (held), one waits for a slot, the rest are deferred."""
ONE_WORKER = FAST.model_copy(update={"max_concurrency": 1})


throttle = own_throttle(default_limit=1)
"""A started throttle in a namespace of the test's own: one slot per tenant."""


async def test_a_deferred_message_dropped_by_a_revocation_leaves_no_mark(
    kafka: Transport, throttle: Throttle, unique: str
) -> None:
    """Revoked while its deferred messages wait for the one worker: their marks go with them.

    Tenant ``acme`` may run one message at a time and the lane lets one wait for a slot: its
    first message runs (held), the second waits, the rest are deferred and queue in the key
    lanes behind the held run. The member rejoins its group (every partition revoked as lost,
    the queued messages dropped, then assigned back). Before, the marks of the dropped messages
    stayed (4 of 4): for the process's life when the partition does not come back, and a
    message read again at a marked offset was taken for deferred whatever the gate decided.
    Once the partition is back, every message runs and nothing stays marked or queued.
    """
    spec = lane_spec(
        f"defrev_{unique}",
        1,
        ordered=False,
        retry={"tiers": ["100ms"]},
        throttle={"keys": ["org:{tenant}"], "max_waiting": 1},
    )
    await declare(kafka, spec)
    app = App([spec])
    started, finish = asyncio.Event(), asyncio.Event()
    ran: set[bytes | None] = set()

    @app.handler(spec.lane)
    async def handle(event: Message, ctx: Context) -> None:
        started.set()
        await finish.wait()
        ran.add(event.key)

    records = [Record(b"{}", b"k%d" % n, headers={h.TENANT: b"acme"}) for n in range(MESSAGES)]
    await produce(kafka, spec.name, records[:1])
    member = Member(app, kafka, f"g-{unique}", ONE_WORKER, throttle=throttle)
    handler, gate = member._handler, member._chain.gate
    assert gate is not None
    tp = TopicPartition(spec.name, 0)
    revoked = asyncio.Event()
    on_revoked = member.on_revoked

    async def recorded(partitions: Sequence[TopicPartition], *, lost: bool) -> Sequence[Position]:
        positions = await on_revoked(partitions, lost=lost)
        revoked.set()
        return positions

    member.on_revoked = recorded  # type: ignore[method-assign]
    async with running(member):
        await asyncio.wait_for(started.wait(), 30)  # the one worker is taken
        await produce(kafka, spec.name, records[1:])
        await eventually(lambda: gate.deferrals == MESSAGES - 2, 30)
        assert handler.deferring == {(tp, n) for n in range(2, MESSAGES)}
        assert member.stats.deferred == 0  # they wait for the worker, none ran
        consumer = member._consumer
        assert consumer is not None
        await consumer.rejoin()
        await asyncio.wait_for(revoked.wait(), 30)
        assert handler.deferring == set()  # dropped unrun with their partition
        finish.set()
        await eventually(lambda: ran == {r.key for r in records}, 60)
        await eventually(lambda: not handler.deferring and not member._chain.lanes.buffered, 30)
