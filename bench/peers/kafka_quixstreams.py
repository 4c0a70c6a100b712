"""quixstreams peer: an ``Application`` with its defaults and one stateless ``update`` step.

``PEER_GROUP`` names the consumer group; values are read as raw bytes.
"""

from __future__ import annotations

import logging
import os
import sys

from _tasks import QUEUE, URL, record, unpack
from quixstreams import Application


def handle(value: bytes) -> None:
    """The handler: one record."""
    record(*unpack(value))


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    app = Application(
        broker_address=URL,
        consumer_group=os.environ["PEER_GROUP"],
        auto_offset_reset="earliest",
        loglevel="WARNING",
        auto_create_topics=False,
    )
    frame = app.dataframe(app.topic(QUEUE, value_deserializer="bytes"))
    frame.update(handle)
    app.run()
