"""A deferral mark belongs to the message the gate deferred, not to every copy of its offset.

After a rejoin, a partition's run that outlived the revocation still holds its slots while the
partition's messages are read again: the re-read copy of that very offset can be deferred (its
tenant floods the lane). Keyed by partition and offset, that copy's mark went when the original
ended, and the copy then ran its handler holding no slot at all.
"""

from __future__ import annotations

from runtime.guard_parts import Producer
from runtime.helpers import eventually, first_run_held, lane_spec, throttled_chain
from support import own_throttle

from pipeline import headers as h
from pipeline.admission.throttle import Throttle
from pipeline.envelope import Message, TopicPartition

throttle = own_throttle(default_limit=1)
"""A started throttle in a namespace of the test's own: one slot per tenant."""


async def test_a_deferred_copy_keeps_its_mark_when_the_original_ends(
    throttle: Throttle, unique: str
) -> None:
    """The original of offset 0 runs on; its re-read copy, deferred, is diverted, not run.

    One worker, tenant ``acme`` one slot, one message may wait. Offset 0 runs (held); the
    partition is revoked and assigned back; offset 5 waits for acme's slot and the copy of
    offset 0 is deferred, queued for the worker behind the original. When the original ends,
    the copy must still go through the first tier: before, it ran its handler without a slot.
    """
    spec = lane_spec(
        f"defcopy_{unique}",
        1,
        ordered=False,
        retry={"tiers": ["100ms"]},
        throttle={"keys": ["org:{tenant}"], "max_waiting": 1},
    )
    app, ran, release = first_run_held(spec)  # offset 0's first run

    producer = Producer()
    tp = TopicPartition(spec.name, 0)
    tenant = {h.TENANT: b"acme"}

    def read(offset: int) -> Message:
        return Message(spec.name, 0, offset, b"k%d" % offset, b"{}", dict(tenant))

    async with throttled_chain(app, throttle, producer, max_concurrency=1) as parts:
        chain, gate, handler, settled = parts.chain, parts.gate, parts.handler, parts.settled
        chain.enter(read(0))
        await eventually(lambda: ran == [0], 30)
        assert chain.drop({tp}) == []  # revoked: the original runs on, holding acme's slot
        chain.enter(read(5))  # assigned back: offset 5 waits for the slot...
        chain.enter(read(0))  # ...so the copy of offset 0 is deferred, queued for the worker
        assert gate.deferrals == 1
        assert len(handler.deferring) == 1
        release.set()
        await eventually(lambda: len(settled) == 3, 30)
        assert sorted(settled) == [(0, "deferred"), (0, "handled"), (5, "handled")]
        assert ran == [0, 5]  # the copy did not run its handler
        assert [topic for topic, _ in producer.sent] == [spec.retry_topic_names()[0]]
        assert not handler.deferring
