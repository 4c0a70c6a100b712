"""faust-streaming peer: one agent with faust's defaults, for both peer benchmarks.

Faust's defaults are kept (aiokafka driver, agent concurrency 1, stream buffer 4,096, commit
every 2.8 s or 10,000 acks); only the web server is off and logging is at WARNING, so nothing
per message is logged. It runs from bench/peers/.venv in one of two ways:

* ``faust_peer.py worker`` (bench/peers_bench.py): the app id and consumer group is
  ``PEER_GROUP``, the topic ``PEER_QUEUE``; the agent records each task (``_tasks.py``) until
  the harness stops it.
* ``faust_peer.py --bootstrap B --topic T --group G --messages N`` (bench/runtime.py): a no-op
  agent timed from the first message to the N-th, then one commit and the RESULT line
  (``_common.py``). The app id is the consumer group, fresh per run; faust's own
  ``<app id>-__assignor-__leader`` topic is deleted by the harness afterwards.
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

TASKS = sys.argv[1:2] == ["worker"]


def make_app(group: str, bootstrap: str, topic_name: str) -> tuple[faust.App, faust.TopicT]:
    """The app with faust's defaults (web server off) and the raw-bytes topic it consumes."""
    app = faust.App(
        group,
        broker=f"kafka://{bootstrap}",
        store="memory://",
        web_enabled=False,
        consumer_auto_offset_reset="earliest",
        topic_replication_factor=1,
    )
    return app, app.topic(topic_name, key_type=bytes, value_type=bytes, value_serializer="raw")


if TASKS:
    from _tasks import QUEUE, URL, record, unpack

    app, topic = make_app(os.environ["PEER_GROUP"], URL, QUEUE)

    @app.agent(topic)
    async def consume(stream: faust.StreamT) -> None:
        """The handler: one record per event."""
        async for value in stream:
            record(*unpack(value))

else:
    from _common import Span, emit, parse_args

    args = parse_args(__doc__.split("\n", 1)[0])
    span = Span(args.messages)
    background: set[asyncio.Future[None]] = set()  # keeps references to fire-and-forget tasks
    app, topic = make_app(args.group, args.bootstrap, args.topic)

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
