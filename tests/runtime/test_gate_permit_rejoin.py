"""A run that outlived its partition's revocation keeps its own throttle slots to the end.

After a rejoin the partition's messages are read again while a run of one of them still holds
its slots. Kept by partition and offset, the gate's permit of that run was replaced by the one
its re-read copy got: the run's end released the copy's slots (the copy then ran holding none),
and the run's own permit stayed live, renewed for the process's life, a slot of its tenant lost.
"""

from __future__ import annotations

import asyncio
from typing import Any

from runtime.guard_parts import Producer
from runtime.helpers import eventually, lane_spec
from support import own_throttle

from pipeline import headers as h
from pipeline.admission.throttle import Throttle
from pipeline.envelope import Message, TopicPartition
from pipeline.retry.policy import default_retryable
from pipeline.retry.router import RetryRouter
from pipeline.runtime import App, Context
from pipeline.runtime.chain import Chain
from pipeline.runtime.guard import RunGuard
from pipeline.runtime.handling import HandlerStage
from pipeline.runtime.isolation import Isolation
from pipeline.runtime.redirect import Redirector
from pipeline.runtime.stats import Stats
from pipeline.runtime.work import Work

throttle = own_throttle(default_limit=2)
"""A started throttle in a namespace of the test's own: two slots per tenant."""


async def test_a_run_past_its_revocation_releases_its_own_slots(
    throttle: Throttle, unique: str
) -> None:
    """Offset 0 runs on past the revocation; its re-read copy asks only once it has ended.

    Ordered lane, tenant ``acme`` two slots. Offset 0 runs (held) and offset 1 of its key
    waits in the gate; the partition is revoked (offset 1 dropped) and assigned back, and
    offset 0 is read again. Every permit taken must be released once all have ended.
    """
    spec = lane_spec(
        f"permrejoin_{unique}",
        1,
        retry={"tiers": ["100ms"]},
        throttle={"keys": ["org:{tenant}"], "max_waiting": 100},
    )
    app = App([spec])
    release = asyncio.Event()
    ran: list[int] = []

    @app.handler(spec.lane)
    async def handle(event: bytes, ctx: Context) -> None:
        ran.append(ctx.message.offset)
        if len(ran) == 1:
            await release.wait()

    lane = app.lanes[spec.lane]
    stats = Stats()
    routing = Redirector(RetryRouter(Producer()), stats, default_retryable, [lane])  # type: ignore[arg-type]
    handler = HandlerStage(app, routing, stats, [lane], cpu_workers=1, throttled=True)
    settled: list[tuple[int, str | None]] = []

    def settle(work: Work, outcome: str | None, _: float) -> None:
        settled.append((work.offset, outcome))

    guard = RunGuard({}, routing, stats, Isolation(5.0), handler, lambda *_: None)
    chain = Chain(
        app, max_concurrency=2, guard=guard, handler=handler, settle=settle, throttle=throttle
    )
    gate = chain.gate
    assert gate is not None
    chain.lanes.start()
    tp = TopicPartition(spec.name, 0)
    live: Any = throttle

    def gate_state(g: Any) -> dict[str, int]:
        return {"acquiring": len(g._acquiring), "permits": len(g._permits)}

    def read(offset: int) -> Message:
        return Message(spec.name, 0, offset, b"a", b"{}", {h.TENANT: b"acme"})

    try:
        chain.enter(read(0))
        await eventually(lambda: ran == [0], 30)
        chain.enter(read(1))  # waits in the gate behind its key's running head
        assert gate.waiting == 1
        assert [w.offset for w in chain.drop({tp})] == []  # revoked: offset 1 forgotten
        assert gate.waiting == 0
        chain.enter(read(0))  # assigned back: offset 0 read again while its run goes on
        # It waits for its key's run to end before it asks (were it asking, let it be admitted).
        await eventually(lambda: not gate_state(gate)["acquiring"] or chain.lanes.buffered == 2, 30)
        release.set()
        await eventually(lambda: len(settled) == 2, 30)
        assert ran == [0, 0]
        await gate.released()
        assert live._live == {}  # every permit released: none renewed for ever
    finally:
        await chain.lanes.close(5)
        await gate.close()
