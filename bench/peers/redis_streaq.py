"""streaq peer: a ``Worker`` as streaq's own benchmark has it (concurrency 32) and a no-op task."""

from __future__ import annotations

import asyncio
import logging
import sys

from _tasks import PAD, QUEUE, URL, paced, record, role
from streaq import Worker

worker = Worker(redis_url=URL, queue_name=QUEUE, concurrency=32)


@worker.task
async def noop(seq: int, enqueued: float, pad: str) -> None:
    """The handler: one record."""
    del pad
    record(seq, enqueued)


async def enqueue_all() -> None:
    """Enqueue the tasks the command line asks for."""
    args = role()
    async with worker:
        await paced(args, lambda seq, now: noop.enqueue(seq, now, PAD))


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    logging.getLogger("streaq").setLevel(logging.WARNING)
    if role().role == "worker":
        worker.run_sync()
    else:
        asyncio.run(enqueue_all())
