"""The due stage: retry-tier messages released at their due time, earliest due first.

The partition keeps flowing while it holds few of them, and is paused while it holds many.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

from pipeline import headers as h
from pipeline.envelope import Message, TopicPartition
from pipeline.runtime.due import HOLD_AHEAD, DueGate
from pipeline.runtime.flow import PauseBook
from pipeline.testing.clock import VirtualClock

TP = TopicPartition("orders.retry.1s", 0)


class Calls:
    """The consumer's pause and resume, as the pause book calls them (nothing else is used)."""

    def __init__(self) -> None:
        """No calls yet."""
        self.calls: list[tuple[str, list[TopicPartition]]] = []

    def pause(self, partitions: Sequence[TopicPartition]) -> None:
        """Record a pause."""
        self.calls.append(("pause", list(partitions)))

    def resume(self, partitions: Sequence[TopicPartition]) -> None:
        """Record a resume."""
        self.calls.append(("resume", list(partitions)))


def due_at(offset: int, due_ms: int) -> Message:
    """A retry copy read at ``offset``, due at ``due_ms`` (ms since the epoch)."""
    return Message(TP.topic, TP.partition, offset, b"k", b"", {h.DUE_MS: str(due_ms).encode()})


async def released_all(count: int, offer: list[Message]) -> tuple[list[int], Calls, list[float]]:
    """Offer ``offer`` to a gate and wait until ``count`` are released.

    Returns their offsets, the consumer's calls, and how late each came in ms (negative: early).
    """
    calls = Calls()
    out: list[int] = []
    lateness: list[float] = []
    done = asyncio.Event()

    def release(message: Message) -> None:
        lateness.append(time.time() * 1000 - h.int_header(message.headers, h.DUE_MS))
        out.append(message.offset)
        if len(out) == count:
            done.set()

    gate: DueGate[Message] = DueGate(PauseBook(calls), release)  # type: ignore[arg-type]
    for message in offer:
        gate.offer(message)
    await asyncio.wait_for(done.wait(), 10)
    return out, calls, lateness


async def test_a_few_waiting_copies_keep_their_partition_flowing() -> None:
    """Copies behind a waiting head stay fetched: no pause, each released at its time, in order."""
    now = int(time.time() * 1000)
    offer = [due_at(i, now + 30 + 10 * i) for i in range(3)]
    out, calls, lateness = await released_all(3, offer)
    assert out == [0, 1, 2]
    assert calls.calls == []
    assert min(lateness) >= 0  # never early


async def test_many_waiting_copies_pause_their_partition_until_half_are_released() -> None:
    """Past HOLD_AHEAD held the partition is paused once, and resumed once half are gone.

    Due half a second ahead: at 30 ms, a loaded host that stalled that long between reading
    the clock and the offers found every copy due already, released in the offer, and no pause.
    """
    now = int(time.time() * 1000)
    count = HOLD_AHEAD + 4
    offer = [due_at(i, now + 500 + i) for i in range(count)]
    out, calls, lateness = await released_all(count, offer)
    assert out == list(range(count))
    assert calls.calls == [("pause", [TP]), ("resume", [TP])]
    assert min(lateness) >= 0


async def test_a_due_copy_with_nothing_held_passes_at_once() -> None:
    """A copy already due, with nothing held before it, is released in the offer itself."""
    out, calls, _ = await released_all(1, [due_at(7, int(time.time() * 1000) - 5)])
    assert (out, calls.calls) == ([7], [])


async def test_a_copy_due_sooner_than_the_one_ahead_of_it_does_not_wait_for_it() -> None:
    """Jittered delays: a copy written later but due first goes at its own time, not after."""
    now = int(time.time() * 1000)
    ahead = due_at(0, now + 60_000)  # still held when the test ends
    offer = [ahead, due_at(1, now + 40), due_at(2, now + 20), due_at(3, now - 5)]
    out, calls, lateness = await released_all(3, offer)
    assert out == [3, 2, 1]  # the one due already at once, then the others as they fall due
    assert calls.calls == []
    assert min(lateness) >= 0


async def test_a_revoked_partition_gives_back_what_it_held_in_the_order_it_came() -> None:
    """Nothing held is released after a drop; what was held comes back by offset."""
    clock = VirtualClock()
    clock.start()
    try:
        now = int(time.time() * 1000)
        released: list[int] = []
        gate: DueGate[Message] = DueGate(PauseBook(Calls()), lambda m: released.append(m.offset))  # type: ignore[arg-type]
        for offset, delay in ((0, 50), (1, 10), (2, 30)):
            gate.offer(due_at(offset, now + delay))
        assert [m.offset for m in gate.drop({TP})] == [0, 1, 2]
        await clock.sleep(1.0)  # past every due time: a timer left behind would release them
        assert released == []
    finally:
        clock.stop()
