"""A minimal consumer-group member on the raw transport: print each message, then commit it.

Run several copies to watch the group share the partitions of `messages`:

    PIPELINE_TRANSPORT=redis python consumers/print_messages.py [GROUP]

The handler runtime (key lanes, retries, dead letters) builds on this same interface.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys

from pipeline.config import load_settings
from pipeline.envelope import Position
from pipeline.transport import create_transport


async def main(group: str) -> None:
    """Consume `messages` as one member of ``group`` until Ctrl-C."""
    transport = create_transport(load_settings())
    consumer = transport.consumer(group, ["messages"])
    try:
        while True:
            batch = await consumer.poll(100, 1.0)
            for msg in batch:
                print(f"[{msg.partition}@{msg.offset}] {msg.key!r}: {msg.value[:80]!r}")  # noqa: T201
            if batch:
                last = {m.tp: m.offset for m in batch}
                await consumer.commit([Position(tp, off + 1) for tp, off in last.items()])
    finally:
        await consumer.close()
        await transport.close()


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "printer"))
