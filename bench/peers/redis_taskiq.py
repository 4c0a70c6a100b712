"""taskiq peer: taskiq-redis's ``RedisStreamBroker`` (acknowledged) and a no-op task.

The worker is taskiq's own ``taskiq worker redis_taskiq:broker``, run as streaq's benchmark runs
it: one worker process, ``--max-async-tasks 32 --max-prefetch 32``. The broker's one change is
``consumer_id="0"``, so the consumer group reads the tasks enqueued before it was created (the
default, ``$``, skips them).
"""

from __future__ import annotations

import asyncio
import logging
import sys

from _tasks import PAD, QUEUE, URL, paced, record, role
from taskiq_redis import RedisStreamBroker

broker = RedisStreamBroker(URL, queue_name=QUEUE, consumer_group_name=QUEUE, consumer_id="0")


@broker.task(task_name="noop")
async def noop(seq: int, enqueued: float, pad: str) -> None:
    """The handler: one record."""
    del pad
    record(seq, enqueued)


async def enqueue_all() -> None:
    """Enqueue the tasks the command line asks for."""
    args = role()
    await broker.startup()
    try:
        await paced(args, lambda seq, now: noop.kiq(seq, now, PAD))
    finally:
        await broker.shutdown()


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    asyncio.run(enqueue_all())
