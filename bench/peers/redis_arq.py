"""arq peer: a ``Worker`` with ``max_jobs`` 32 (streaq's benchmark workload) and a no-op job.

Otherwise arq's defaults (poll delay 0.5 s, results kept 1 h).

Job ids carry the queue name, so the harness can delete every key of the run by pattern.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from typing import Any

from _tasks import PAD, QUEUE, URL, paced, record, role
from arq import create_pool
from arq.connections import RedisSettings
from arq.worker import Worker

SETTINGS = RedisSettings.from_dsn(URL)


async def noop(_ctx: dict[str, Any], seq: int, enqueued: float, pad: str) -> None:
    """The handler: one record."""
    del pad
    record(seq, enqueued)


async def enqueue_all() -> None:
    """Enqueue the tasks the command line asks for."""
    args = role()
    pool = await create_pool(SETTINGS, default_queue_name=QUEUE)
    try:
        await paced(
            args,
            lambda seq, now: pool.enqueue_job("noop", seq, now, PAD, _job_id=f"{QUEUE}-{seq}"),
        )
    finally:
        await pool.aclose()


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    if role().role == "worker":
        Worker(functions=[noop], redis_settings=SETTINGS, queue_name=QUEUE, max_jobs=32).run()
    else:
        asyncio.run(enqueue_all())
