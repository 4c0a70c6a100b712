"""The in-memory consumer's poll keeps a cancellation that lands as it is woken."""

from __future__ import annotations

import asyncio

import pytest

from pipeline.testing.memory.transport import MemoryTransport
from pipeline.transport.protocol import TopicConfig


async def test_a_poll_cancelled_as_a_change_wakes_it_is_cancelled() -> None:
    """The cancellation is raised, not lost: the poll waited under asyncio.wait_for.

    On Python 3.11 ``wait_for`` returns instead of raising when the cancellation lands in the
    turn of the loop its awaited result arrives in (CPython issue 86296): the poll then went on
    waiting until its timeout and returned, and a user's test stopping it waited that long.
    """
    transport = MemoryTransport()
    await transport.admin().create_topic(TopicConfig("events", 1))
    consumer = transport.consumer("g", ["events"])
    polling = asyncio.create_task(consumer.poll(timeout_s=3.0))
    for _ in range(3):  # steps, not time: the poll joins, finds nothing and waits for a change
        await asyncio.sleep(0)
    transport.broker.notify()  # a change wakes it...
    polling.cancel()  # ...in the same turn as it is cancelled
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(polling, 10)
    await consumer.close()
