"""faust-streaming peer: one agent with faust's defaults (aiokafka driver, concurrency 1).

The app id is ``PEER_GROUP`` (the consumer group); the web server is off, logging at WARNING.
"""

from __future__ import annotations

import logging
import os
import sys

import faust
from _tasks import QUEUE, URL, record, unpack

app = faust.App(
    os.environ["PEER_GROUP"],
    broker=f"kafka://{URL}",
    store="memory://",
    web_enabled=False,
    consumer_auto_offset_reset="earliest",
    topic_replication_factor=1,
)
topic = app.topic(QUEUE, key_type=bytes, value_type=bytes, value_serializer="raw")


@app.agent(topic)
async def consume(stream: faust.StreamT) -> None:
    """The handler: one record per event."""
    async for value in stream:
        record(*unpack(value))


if __name__ == "__main__":
    sys.argv = [sys.argv[0], "worker", "--loglevel", "warn", "--without-web"]
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    app.main()
