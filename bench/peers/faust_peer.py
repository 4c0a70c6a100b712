"""faust-streaming peer: one agent with a no-op body over the benchmark topic.

Run by bench/runtime.py with bench/peers/.venv/bin/python. Faust's defaults are kept (aiokafka
driver, agent concurrency 1, stream buffer 4,096, commit every 2.8 s or 10,000 acks); only the
web server is off and logging is at WARNING, so nothing per message is logged. The app id is the
consumer group, fresh per run; faust's own ``<app id>-__assignor-__leader`` topic is deleted by
the harness afterwards.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import time
from importlib.metadata import version

import faust
from _common import Span, emit, parse_args

args = parse_args(__doc__.split("\n", 1)[0])
span = Span(args.messages)
background: set[asyncio.Future[None]] = set()  # keeps references to fire-and-forget tasks
app = faust.App(
    args.group,
    broker=f"kafka://{args.bootstrap}",
    store="memory://",
    web_enabled=False,
    consumer_auto_offset_reset="earliest",
    topic_replication_factor=1,
)
topic = app.topic(args.topic, key_type=bytes, value_type=bytes, value_serializer="raw")


def noop(_value: bytes) -> None:
    """The handler: does nothing."""


async def finish() -> None:
    """Report, commit what was acked, then shut the worker down like SIGTERM does."""
    commit_t0 = time.perf_counter()
    await asyncio.sleep(0)  # let the stream ack the last event
    committed = await app.consumer.commit()
    commit_s = time.perf_counter() - commit_t0
    emit(
        span.result(
            "faust",
            version=version("faust-streaming"),
            driver="aiokafka " + version("aiokafka"),
            commit_s=commit_s,
            committed=bool(committed),
        )
    )
    os.kill(os.getpid(), signal.SIGTERM)


@app.agent(topic)
async def consume(stream: faust.StreamT) -> None:
    """No-op agent."""
    async for value in stream:
        noop(value)
        if span.handled():
            background.add(asyncio.ensure_future(finish()))


async def watchdog() -> None:
    """Exit if the run does not finish in time."""
    await asyncio.sleep(args.timeout)
    print(f"faust peer: timeout, {span.count} of {args.messages} handled", file=sys.stderr)
    os._exit(2)


@app.task
async def start_watchdog() -> None:
    """Arm the watchdog once the app runs."""
    background.add(asyncio.ensure_future(watchdog()))


if __name__ == "__main__":
    sys.argv = [sys.argv[0], "worker", "--loglevel", "warn", "--without-web"]
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    app.main()
