"""A run that outlived its partition's revocation keeps its own throttle slots to the end.

After a rejoin the partition's messages are read again while a run of one of them still holds
its slots. Kept by partition and offset, the gate's permit of that run was replaced by the one
its re-read copy got: the run's end released the copy's slots (the copy then ran holding none),
and the run's own permit stayed live, renewed for the process's life, a slot of its tenant lost.
"""

from __future__ import annotations

from typing import Any

from runtime.guard_parts import Producer
from runtime.helpers import eventually, first_run_held, lane_spec, throttled_chain
from support import own_throttle

from pipeline import headers as h
from pipeline.admission.throttle import Throttle
from pipeline.envelope import Message, TopicPartition

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
    app, ran, release = first_run_held(spec)

    tp = TopicPartition(spec.name, 0)
    live: Any = throttle

    def gate_state(g: Any) -> dict[str, int]:
        return {"acquiring": len(g._acquiring), "permits": len(g._permits)}

    def read(offset: int) -> Message:
        return Message(spec.name, 0, offset, b"a", b"{}", {h.TENANT: b"acme"})

    async with throttled_chain(app, throttle, Producer(), max_concurrency=2) as parts:
        chain, gate, settled = parts.chain, parts.gate, parts.settled
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
