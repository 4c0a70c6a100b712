"""One Kafka producer in a process of its own, reporting the name librdkafka logs it under.

Usage: python producer_name_proc.py TOPIC
Sends one message to TOPIC through the Kafka transport's producer (the test settings, with
librdkafka's ``generic`` debug lines on), closes it, and prints one JSON line: this process's id
and the client names of the librdkafka log lines it received (``[name]`` in "FAC [name] text").
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from support import test_settings

from pipeline.transport.kafka.transport import KafkaTransport

LIBRDKAFKA_LINE = "%s [%s] %s"
"""librdkafka's call of its ``logger``: facility, client name, text."""


class Names(logging.Handler):
    """Keeps the client name of every librdkafka line."""

    def __init__(self) -> None:
        """No name heard yet."""
        super().__init__(logging.DEBUG)
        self.names: set[str] = set()

    def emit(self, record: logging.LogRecord) -> None:
        """Keep the name of a librdkafka line; pass over any other."""
        if record.msg == LIBRDKAFKA_LINE and isinstance(record.args, tuple):
            self.names.add(str(record.args[1]))


async def main(topic: str) -> None:
    """Send one message, close the producer, print what was heard."""
    base = test_settings()
    kafka = base.kafka.model_copy(update={"client": {**base.kafka.client, "debug": "generic"}})
    names = Names()
    heard = logging.getLogger("pipeline.librdkafka")
    heard.setLevel(logging.DEBUG)
    heard.addHandler(names)
    transport = KafkaTransport(base.model_copy(update={"kafka": kafka}))
    producer = transport.producer()
    try:
        await producer.send(topic, b"v", key=b"k")
    finally:
        await producer.close()
        await transport.close()
    sys.stdout.write(json.dumps({"pid": os.getpid(), "names": sorted(names.names)}) + "\n")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
