"""FastStream peer: one ``KafkaBroker`` subscriber (aiokafka backend), for both peer benchmarks.

FastStream's defaults are kept (one ``getone()`` per message, ``AckPolicy.ACK_FIRST``: aiokafka
auto-commit every 5 s, i.e. offsets are committed as consumed, not after handling), except that
the per-message "Received" and "Processed" log lines are switched off (``logger=None``); they
are FastStream's default and would otherwise dominate a tiny handler. It runs from
bench/peers/.venv in one of two ways:

* ``faststream_peer.py worker`` (bench/peers_bench.py): the group is ``PEER_GROUP``, the topic
  ``PEER_QUEUE``; the handler records each task (``_tasks.py``) until the harness stops it.
* ``faststream_peer.py --bootstrap B --topic T --group G --messages N`` (bench/runtime.py): a
  no-op handler timed from the first message to the N-th, then one commit and the RESULT line
  (``_common.py``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import time
from importlib.metadata import version

from _common import Span, emit, parse_args
from _tasks import QUEUE, URL, record, unpack
from faststream import FastStream
from faststream.kafka import KafkaBroker


def tasks_worker() -> None:
    """Record every task of ``PEER_QUEUE`` until stopped (bench/peers_bench.py)."""
    broker = KafkaBroker(URL, logger=None)

    @broker.subscriber(QUEUE, group_id=os.environ["PEER_GROUP"], auto_offset_reset="earliest")
    async def handle(body: bytes) -> None:
        """The handler: one record."""
        record(*unpack(body))

    asyncio.run(FastStream(broker, logger=None).run())


async def timed() -> int:
    """Start the broker, wait for the last message, commit, stop (bench/runtime.py)."""
    args = parse_args(__doc__.split("\n", 1)[0])
    span = Span(args.messages)
    done = asyncio.Event()
    broker = KafkaBroker(args.bootstrap, logger=None)
    subscriber = broker.subscriber(args.topic, group_id=args.group, auto_offset_reset="earliest")

    @subscriber
    async def handle(body: bytes) -> None:
        del body  # a no-op handler; FastStream still decodes the body for it
        if span.handled():
            done.set()

    async with broker:
        await broker.start()
        try:
            await asyncio.wait_for(done.wait(), args.timeout)
        except TimeoutError:
            print(f"faststream peer: timeout, {span.count} handled", file=sys.stderr)
            return 2
        commit_t0 = time.perf_counter()
        await subscriber.consumer.commit()  # the positions consumed so far, all of them
        commit_s = time.perf_counter() - commit_t0
        emit(
            span.result(
                "faststream",
                version=version("faststream"),
                backend="aiokafka " + version("aiokafka"),
                commit_s=commit_s,
            )
        )
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    if sys.argv[1:2] == ["worker"]:
        tasks_worker()
    else:
        sys.exit(asyncio.run(timed()))
