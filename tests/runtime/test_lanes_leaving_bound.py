"""Leaving work (deferrals) waits behind the keys with work to run, but not for ever.

Under steady load the ready keys never ran out, so a deferral never got a worker: its message
stayed buffered, and a partition paused full with deferrals in its buffer stayed paused for as
long as the load lasted (and a revocation waited for them until its grace ran out).
"""

from __future__ import annotations

import asyncio

from pipeline.envelope import Message
from pipeline.runtime.lanes import LEAVING_EVERY, KeyLanes


def _message(key: str, value: str) -> Message:
    return Message("t", 0, 0, key.encode(), value.encode(), {})


async def test_leaving_work_gets_a_worker_under_steady_load() -> None:
    """One worker, every run queues another key's run: the deferral still runs, early."""
    order: list[str] = []
    total = 200
    lanes: KeyLanes[Message]

    async def process(message: Message) -> None:
        order.append(message.value.decode())
        if message.value.startswith(b"run") and len(order) < total:
            lanes.submit(_message(f"k{len(order)}", f"run-{len(order)}"), ordered=True)
        await asyncio.sleep(0)

    lanes = KeyLanes(process, 1)
    lanes.submit(_message("k0", "run-0"), ordered=True)
    lanes.submit(_message("k1", "run-1"), ordered=True)
    lanes.submit(_message("d", "leaving"), ordered=True, leaving=True)
    lanes.start()
    try:
        await lanes.wait_idle()
        assert "leaving" in order
        assert order.index("leaving") <= LEAVING_EVERY, order[: LEAVING_EVERY + 2]
        assert order[0] == "run-0"  # keys with work to run still go first
    finally:
        await lanes.close(5)


async def test_leaving_work_takes_at_most_its_share_of_the_workers() -> None:
    """Ten deferrals and ten runs queued together: the runs are not held behind them."""
    order: list[str] = []

    async def process(message: Message) -> None:
        order.append(message.value.decode())
        await asyncio.sleep(0)

    lanes: KeyLanes[Message] = KeyLanes(process, 1)
    for n in range(10):
        lanes.submit(_message(f"d{n}", f"leaving-{n}"), ordered=True, leaving=True)
    for n in range(10):
        lanes.submit(_message(f"k{n}", f"run-{n}"), ordered=True)
    lanes.start()
    try:
        await lanes.wait_idle()
        first = order[: 10 + 10 // (LEAVING_EVERY - 1)]
        assert all(f"run-{n}" in first for n in range(10)), order
    finally:
        await lanes.close(5)
