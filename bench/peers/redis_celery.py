"""Celery peer: the Redis broker, no result backend, a no-op task.

The worker is Celery's own, with its defaults (prefork pool, one process per CPU); its log
level is WARNING. Every key of the run carries the queue name (kombu's ``global_keyprefix``),
so the harness can delete them by pattern and Celery's global ``unacked`` keys stay apart.
"""

from __future__ import annotations

import logging
import sys

from _tasks import PAD, QUEUE, URL, paced_sync, record, role
from celery import Celery

app = Celery("bench_peer", broker=URL)
app.conf.update(
    task_default_queue=QUEUE,
    broker_transport_options={"global_keyprefix": f"{QUEUE}:"},
    worker_hijack_root_logger=False,
    broker_connection_retry_on_startup=True,
)


@app.task(name="noop")
def noop(seq: int, enqueued: float, pad: str) -> None:
    """The handler: one record."""
    del pad
    record(seq, enqueued)


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    args = role()
    if args.role == "worker":
        app.worker_main(["worker", "--loglevel", "WARNING", "-Q", QUEUE])
    else:
        paced_sync(args, lambda seq, now: noop.apply_async((seq, now, PAD)))
