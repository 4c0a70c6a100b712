"""The throttle gate's ask pacing (``ASKING_AT_ONCE``) must not lose room for good.

An acquisition withdrawn before its task had run a step (a revocation or a spill in the same
turn of the event loop as the offer) never ran the code that gives its room back: each such
withdrawal took one of the group's ``ASKING_AT_ONCE`` places for the process's life, and after
that many every head of the group waited in the member for ever (its key stranded).
"""

from __future__ import annotations

import pytest
from runtime.helpers import eventually
from support import own_throttle

from pipeline import headers as h
from pipeline.admission.throttle import Throttle
from pipeline.envelope import Message, TopicPartition
from pipeline.runtime.throttle_gate import ASKING_AT_ONCE, ThrottleGate
from pipeline.topics.spec import ThrottlePolicy

throttle = own_throttle(default_limit=100)
"""A started throttle in a namespace of the test's own: room for every head here."""

POLICY = ThrottlePolicy.model_validate({"keys": ["org:{tenant}"]})


def _message(offset: int, partition: int = 0, key: bytes | None = None) -> Message:
    key = b"k%d" % offset if key is None else key
    return Message("pace", partition, offset, key, b"{}", {h.TENANT: b"acme"})


@pytest.mark.redis
async def test_acquisitions_dropped_before_they_ran_give_their_room_back(
    throttle: Throttle,
) -> None:
    """ASKING_AT_ONCE heads of partition 1 revoked in the turn they came: partition 0 asks."""
    admitted: list[Message] = []
    gate: ThrottleGate[Message] = ThrottleGate(throttle, admitted.append, admitted.append)
    try:
        for n in range(ASKING_AT_ONCE):
            gate.offer(_message(n, 1), POLICY, "pace", ordered=False, busy=False, can_defer=False)
        gate.drop([TopicPartition("pace", 1)])  # before any acquisition ran a step
        gate.offer(_message(99, 0), POLICY, "pace", ordered=False, busy=False, can_defer=False)
        await eventually(lambda: len(admitted) == 1, 10)
        assert admitted[0].offset == 99
    finally:
        for message in admitted:
            gate.finished(message)
        await gate.close()


@pytest.mark.redis
async def test_acquisitions_spilled_before_they_ran_give_their_room_back(
    throttle: Throttle,
) -> None:
    """ASKING_AT_ONCE keys (2 messages each) spilled in the turn they came: the next one asks."""
    admitted: list[Message] = []
    deferred: list[Message] = []
    gate: ThrottleGate[Message] = ThrottleGate(throttle, admitted.append, deferred.append)
    tp = TopicPartition("pace", 0)
    try:
        for n in range(2 * ASKING_AT_ONCE):
            message = _message(n, key=b"k%d" % (n // 2))
            gate.offer(
                message, POLICY, "pace", ordered=True, busy=False, can_defer=True, can_spill=True
            )
        assert len(gate.spill(tp, 2 * ASKING_AT_ONCE)) == 2 * ASKING_AT_ONCE
        gate.offer(
            _message(99, key=b"other"), POLICY, "pace", ordered=True, busy=False, can_defer=True
        )
        await eventually(lambda: len(admitted) == 1, 10)
        assert admitted[0].offset == 99
    finally:
        for message in admitted:
            gate.finished(message)
        await gate.close()


@pytest.mark.redis
async def test_a_spilled_key_leaves_no_waiter_in_redis_and_asks_again_when_offered(
    throttle: Throttle,
) -> None:
    """One slot held by ``busy``; ``k``'s head asking behind it is spilled: Redis forgets it.

    A message of ``k`` read after the spill asks as any other, once ``busy`` is done.
    """
    await throttle.set_limit("org:acme", 1)
    admitted: list[Message] = []
    deferred: list[Message] = []
    gate: ThrottleGate[Message] = ThrottleGate(throttle, admitted.append, deferred.append)
    tp = TopicPartition("pace", 0)

    def offer(message: Message) -> None:
        gate.offer(
            message, POLICY, "pace", ordered=True, busy=False, can_defer=True, can_spill=True
        )

    try:
        offer(_message(0, key=b"busy"))
        await eventually(lambda: len(admitted) == 1, 10)
        for n in (1, 2, 3):
            offer(_message(n, key=b"k"))
        await eventually(lambda: len(gate._acquiring) == 1, 10)
        assert len(gate.spill(tp, 10)) == 3
        assert [m.offset for m in deferred] == [1, 2, 3]
        await eventually(lambda: not gate._asking, 10)
        offer(_message(4, key=b"k"))
        gate.finished(admitted[0])
        await eventually(lambda: len(admitted) == 2, 10)
        assert admitted[1].offset == 4
        gate.finished(admitted[1])
        await gate.released()
        status = await throttle.status("org:acme")
        assert not status.waiters
        assert not status.holders
    finally:
        await gate.close()


@pytest.mark.redis
async def test_a_spill_picks_the_tenant_with_most_that_may_go(throttle: Throttle) -> None:
    """Beta's 5 copies back from a tier may not go; acme's 3 on one key do, and go.

    Counted with the copies, beta held most of the partition: the spill picked beta, found
    nothing of it to send away, and the partition stayed paused behind acme's key.
    """
    await throttle.set_limit("org:acme", 0)
    await throttle.set_limit("org:beta", 0)
    admitted: list[Message] = []
    deferred: list[Message] = []
    gate: ThrottleGate[Message] = ThrottleGate(throttle, admitted.append, deferred.append)
    tp = TopicPartition("pace", 0)
    try:
        for n in range(5):  # copies back from a tier: each its own key, never spilled
            copy = Message("pace", 0, n, b"b%d" % n, b"{}", {h.TENANT: b"beta"})
            gate.offer(copy, POLICY, "pace", ordered=True, busy=False, can_defer=False)
        for n in range(5, 8):
            message = Message("pace", 0, n, b"k", b"{}", {h.TENANT: b"acme"})
            gate.offer(
                message, POLICY, "pace", ordered=True, busy=False, can_defer=True, can_spill=True
            )
        assert len(gate.spill(tp, 10)) == 3
        assert [m.offset for m in deferred] == [5, 6, 7]
    finally:
        await gate.close()
