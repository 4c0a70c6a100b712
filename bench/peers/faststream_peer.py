"""FastStream peer: one ``KafkaBroker`` subscriber (aiokafka backend) with a no-op handler.

Run by bench/runtime.py with bench/peers/.venv/bin/python. FastStream's defaults are kept (one
``getone()`` per message, ``AckPolicy.ACK_FIRST``: aiokafka auto-commit every 5 s, i.e. offsets
are committed as consumed, not after handling), except that the per-message "Received" and
"Processed" log lines are switched off (``logger=None``); they are FastStream's default and would
otherwise dominate a no-op handler.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from importlib.metadata import version

from _common import Span, emit, parse_args
from faststream.kafka import KafkaBroker

args = parse_args(__doc__.split("\n", 1)[0])


async def main() -> int:
    """Start the broker, wait for the last message, commit, stop."""
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
    sys.exit(asyncio.run(main()))
