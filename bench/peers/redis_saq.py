"""saq peer: a ``Worker`` with concurrency 32 (streaq's benchmark workload) and a no-op job."""

from __future__ import annotations

import asyncio
import logging
import sys
from typing import Any

from _tasks import PAD, QUEUE, URL, paced, record, role
from saq import Queue, Worker


async def noop(_ctx: dict[str, Any], *, seq: int, enqueued: float, pad: str) -> None:
    """The handler: one record."""
    del pad
    record(seq, enqueued)


async def main() -> None:
    """Run the worker or enqueue the tasks the command line asks for."""
    args = role()
    queue = Queue.from_url(URL, name=QUEUE)
    await queue.connect()
    try:
        if args.role == "worker":
            await Worker(queue, functions=[noop], concurrency=32).start()
        else:
            await paced(
                args, lambda seq, now: queue.enqueue("noop", seq=seq, enqueued=now, pad=PAD)
            )
    finally:
        await queue.disconnect()


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    asyncio.run(main())
