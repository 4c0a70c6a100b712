"""Key lanes: per-key order, no overlap per key, concurrency across keys, bounded workers."""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections import defaultdict

import pytest

from pipeline.envelope import Message, TopicPartition
from pipeline.runtime.lanes import KeyLanes

TP = TopicPartition("t", 0)


def msg(offset: int, key: bytes) -> Message:
    """A message of partition t/0."""
    return Message("t", 0, offset, key, b"")


async def test_same_key_runs_in_order_and_never_overlaps() -> None:
    """Per key, processing order equals submission order and two never run together."""
    running: set[bytes] = set()
    order: dict[bytes, list[int]] = defaultdict(list)
    overlaps = 0

    async def process(m: Message) -> None:
        nonlocal overlaps
        assert m.key is not None
        if m.key in running:
            overlaps += 1
        running.add(m.key)
        await asyncio.sleep(random.uniform(0, 0.002))  # simulated handler latency
        order[m.key].append(m.offset)
        running.discard(m.key)

    lanes = KeyLanes(process, max_concurrency=16)
    lanes.start()
    for i in range(600):
        lanes.submit(msg(i, f"k{i % 30}".encode()), ordered=True)
    await asyncio.wait_for(lanes.wait_idle(), 30)
    await lanes.close()
    assert overlaps == 0
    assert sum(len(v) for v in order.values()) == 600
    assert all(v == sorted(v) for v in order.values())


async def test_different_keys_run_concurrently_up_to_the_limit() -> None:
    """With more keys than workers, exactly max_concurrency messages run at once."""
    peak = 0
    now = 0
    gate, full = asyncio.Event(), asyncio.Event()

    async def process(_m: Message) -> None:
        nonlocal peak, now
        now += 1
        peak = max(peak, now)
        if now == 5:
            full.set()
        await gate.wait()
        now -= 1

    lanes = KeyLanes(process, max_concurrency=5)
    lanes.start()
    for i in range(20):
        lanes.submit(msg(i, f"k{i}".encode()), ordered=True)
    await asyncio.wait_for(full.wait(), 10)
    assert lanes.buffered == 20
    gate.set()
    await asyncio.wait_for(lanes.wait_idle(), 10)
    await lanes.close()
    assert peak == 5


async def test_unordered_messages_of_one_key_run_concurrently() -> None:
    """On an unordered lane one key's messages do not wait for each other."""
    peak = 0
    now = 0
    gate, full = asyncio.Event(), asyncio.Event()

    async def process(_m: Message) -> None:
        nonlocal peak, now
        now += 1
        peak = max(peak, now)
        if now == 4:
            full.set()
        await gate.wait()
        now -= 1

    lanes = KeyLanes(process, max_concurrency=4)
    lanes.start()
    for i in range(4):
        lanes.submit(msg(i, b"same"), ordered=False)
    await asyncio.wait_for(full.wait(), 10)
    gate.set()
    await asyncio.wait_for(lanes.wait_idle(), 10)
    await lanes.close()
    assert peak == 4


async def test_a_key_submitted_first_runs_before_the_keys_waiting_for_a_worker() -> None:
    """A retry copy whose delay is over does not wait behind fresh keys, nor its key's queue.

    One worker, busy with k0; k1..k3 wait for it. A message of a new key submitted ``first``
    runs next, then the waiting keys in their turn; one of a key that has messages queued
    stays behind them (per-key order is never given up).
    """
    gate, started = asyncio.Event(), asyncio.Event()
    order: list[bytes] = []

    async def process(m: Message) -> None:
        assert m.key is not None
        order.append(m.key)
        started.set()
        await gate.wait()

    lanes = KeyLanes(process, max_concurrency=1)
    lanes.start()
    for i in range(4):
        lanes.submit(msg(i, f"k{i}".encode()), ordered=True)
    await asyncio.wait_for(started.wait(), 10)
    lanes.submit(msg(4, b"k2"), ordered=True, first=True)  # k2 is queued: behind it
    lanes.submit(msg(5, b"due"), ordered=True, first=True)
    gate.set()
    await asyncio.wait_for(lanes.wait_idle(), 10)
    await lanes.close()
    assert order == [b"k0", b"due", b"k1", b"k2", b"k3", b"k2"]


async def test_drop_forgets_queued_messages_but_keeps_running_ones() -> None:
    """Dropping a partition returns its queued messages; the running head still finishes."""
    gate, started = asyncio.Event(), asyncio.Event()
    done: list[int] = []

    async def process(m: Message) -> None:
        started.set()
        await gate.wait()
        done.append(m.offset)

    lanes = KeyLanes(process, max_concurrency=1)
    lanes.start()
    for i in range(3):
        lanes.submit(msg(i, b"k"), ordered=True)
    await asyncio.wait_for(started.wait(), 10)
    assert lanes.running_on([TP]) == 1
    dropped = lanes.drop([TP])
    assert [m.offset for m in dropped] == [1, 2]
    gate.set()
    await asyncio.wait_for(lanes.wait_idle([TP]), 10)
    await lanes.close()
    assert done == [0]


async def test_a_key_dropped_while_waiting_for_a_worker_runs_once_when_read_again() -> None:
    """A partition revoked and assigned back: its messages, read again, run one at a time.

    The key was waiting for a worker (not running) when its partition was dropped; were it
    left in the ready queue, reading its messages again would queue it twice, two workers
    would run the key at once, and one of them would die at the end.
    """
    busy = asyncio.Event()
    seen: list[int] = []
    running = 0
    overlaps = 0

    async def process(m: Message) -> None:
        nonlocal overlaps, running
        if m.partition == 1:  # another partition's messages hold both workers for a while
            await busy.wait()
            return
        if running:
            overlaps += 1
        running += 1
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        seen.append(m.offset)
        running -= 1

    lanes = KeyLanes(process, max_concurrency=2)
    lanes.start()
    for key in (b"a", b"b"):
        lanes.submit(Message("t", 1, 0, key, b""), ordered=True)
    for i in (3, 4):
        lanes.submit(msg(i, b"k"), ordered=True)
    await asyncio.sleep(0)  # both workers are busy; k waits for one
    assert lanes.running == 2
    assert [m.offset for m in lanes.drop([TP])] == [3, 4]
    for i in (3, 4):  # read again from the last commit
        lanes.submit(msg(i, b"k"), ordered=True)
    busy.set()
    await asyncio.wait_for(lanes.wait_idle(), 10)
    assert seen == [3, 4]
    assert overlaps == 0
    assert not any(w.done() for w in lanes._workers)  # no worker died
    await lanes.close()


def test_concurrency_must_be_positive() -> None:
    """Zero workers is refused with a clear error."""

    async def noop(_m: Message) -> None: ...

    with pytest.raises(ValueError, match="max_concurrency"):
        KeyLanes(noop, max_concurrency=0)


async def test_a_stop_absorbed_below_a_run_still_ends_its_worker() -> None:
    """close() ends a worker whose run absorbed the stop, instead of running the next message.

    redis-py writes under ``asyncio.wait_for``, which on Python 3.11 can absorb a cancellation
    that arrives as the write completes (CPython issue 86296); the run here absorbs it the same
    way. Without the check, the worker ran the next message and waited for more, for ever.
    """
    ran: list[int] = []
    running = asyncio.Event()

    async def process(m: Message) -> None:
        ran.append(m.offset)
        running.set()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.Event().wait()  # the stop arrives here and goes no further

    lanes = KeyLanes(process, max_concurrency=1)
    lanes.start()
    lanes.submit(msg(0, b"a"), ordered=True)
    lanes.submit(msg(1, b"b"), ordered=True)
    await asyncio.wait_for(running.wait(), 10)
    await asyncio.wait_for(lanes.close(), 10)
    assert ran == [0]
