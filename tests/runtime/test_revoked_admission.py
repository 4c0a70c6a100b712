"""A message admitted while its partition's revocation waits for runs does not outlive it.

A rebalance that revokes a partition (not lost) first drops its queued work, then waits for its
running work to finish (within the grace) before handing the partition over. A message of that
partition waiting in the throttle gate must not be admitted during that wait: it would be
queued in the key lanes after their drop and, once the wait ran out, run after the revocation,
beside the partition's next owner, its slots already given back.
"""

from __future__ import annotations

import asyncio

from runtime.helpers import FAST, declare, eventually, lane_spec, produce, running
from support import own_throttle

from pipeline import headers as h
from pipeline.admission.throttle import Throttle
from pipeline.envelope import Message, Record, TopicPartition
from pipeline.runtime import App, Context
from pipeline.runtime.member import Member
from pipeline.transport.protocol import Transport

ONE_WORKER = FAST.model_copy(update={"max_concurrency": 1, "shutdown_grace_s": 1.0})
"""One worker, and a revocation that waits at most a second for the runs of its partitions."""


throttle = own_throttle(default_limit=1)
"""A started throttle in a namespace of the test's own: one slot per tenant."""


async def test_a_message_waiting_for_admission_is_not_admitted_during_the_revocation(
    kafka: Transport, throttle: Throttle, unique: str
) -> None:
    """Its slot frees while the revocation waits for the one run: it stays out of the lanes.

    ``a`` (tenant ``beta``) runs, held, on the one worker; ``b`` (tenant ``acme``, whose one
    slot another member holds) waits in the gate. The partition is revoked (not lost) and the
    revocation waits for ``a``; meanwhile the other member gives the slot back. Before, ``b``
    was then admitted into the key lanes, stayed queued there when the wait ran out, and ran
    once ``a`` ended, after its partition was handed over (its slot already released).
    """
    spec = lane_spec(f"revadm_{unique}", 1, ordered=False, throttle={"keys": ["org:{tenant}"]})
    await declare(kafka, spec)
    app = App([spec])
    started, finish = asyncio.Event(), asyncio.Event()
    ran: list[bytes | None] = []

    @app.handler(spec.lane)
    async def handle(event: Message, ctx: Context) -> None:
        started.set()
        await finish.wait()
        ran.append(event.key)

    elsewhere = await throttle.acquire(["org:acme"])  # another member holds acme's one slot
    member = Member(app, kafka, f"g-{unique}", ONE_WORKER, throttle=throttle)
    lanes, gate = member._chain.lanes, member._chain.gate
    assert gate is not None
    tp = TopicPartition(spec.name, 0)
    async with running(member):
        await produce(kafka, spec.name, [Record(b"{}", b"a", headers={h.TENANT: b"beta"})])
        await asyncio.wait_for(started.wait(), 30)
        await produce(kafka, spec.name, [Record(b"{}", b"b", headers={h.TENANT: b"acme"})])
        await eventually(lambda: gate.waiting == 1, 30)
        revoking = asyncio.create_task(member.on_revoked([tp], lost=False))  # a rebalance
        await eventually(lambda: lanes._idle_waiters == 1, 30)  # it waits for the run of a
        await throttle.release(elsewhere)
        await revoking  # the wait ran out, a still running
        assert gate.waiting == 0
        assert lanes.buffered == 1  # only a, running: b was not admitted after the drop
        finish.set()
        await eventually(lambda: not lanes.buffered, 30)
        await gate.released()
    assert ran == [b"a"]  # b is its partition's next owner's
