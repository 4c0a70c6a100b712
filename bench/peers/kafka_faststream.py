"""FastStream peer (aiokafka backend): one subscriber, FastStream's defaults, no per-message log.

``PEER_GROUP`` names the consumer group; the topic is ``PEER_QUEUE``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys

from _tasks import QUEUE, URL, record, unpack
from faststream import FastStream
from faststream.kafka import KafkaBroker

broker = KafkaBroker(URL, logger=None)


@broker.subscriber(QUEUE, group_id=os.environ["PEER_GROUP"], auto_offset_reset="earliest")
async def handle(body: bytes) -> None:
    """The handler: one record."""
    record(*unpack(body))


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    asyncio.run(FastStream(broker, logger=None).run())
