"""A group member in its own process, so tests can kill -9 it (in-process for the memory broker).

Usage: python member_proc.py TRANSPORT GROUP TOPIC MODE
  MODE=commit: print each message as a JSON line, then commit it (before the next poll).
  MODE=hold:   consume until EXPECT (env) messages arrived, commit the first half of every
               partition, print "holding" and wait to be killed.
Settings come from the environment (PIPELINE_*), as for any pipeline process.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from collections.abc import Callable

from contract.helpers import positions_after
from support import test_settings

from pipeline.envelope import Position, TopicPartition
from pipeline.transport import create_transport
from pipeline.transport.protocol import Transport

Emit = Callable[[dict[str, object]], None]


def emit(obj: object) -> None:
    """One JSON line on stdout, flushed at once so the parent sees it before a kill."""
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


async def run_member(
    transport: Transport, group: str, topic: str, mode: str, expect: int, out: Emit
) -> None:
    """Consume as MODE says (module docstring), reporting through ``out``, until cancelled."""
    consumer = transport.consumer(group, [topic])
    received = []
    while True:
        batch = await consumer.poll(100, 0.5)
        if mode == "commit":
            for msg in batch:
                out({"p": msg.partition, "o": msg.offset})
            if batch:
                await consumer.commit(positions_after(batch))
            continue
        received += batch
        if len(received) >= expect:
            break
    by_partition: dict[int, list[int]] = {}
    for msg in received:
        by_partition.setdefault(msg.partition, []).append(msg.offset)
    committed = {}
    positions = []
    for partition, offsets in by_partition.items():
        half = sorted(offsets)[len(offsets) // 2]
        committed[partition] = half
        positions.append(Position(TopicPartition(topic, partition), half))
    await consumer.commit(positions)
    out({"holding": committed})
    await asyncio.Event().wait()


async def main(transport_name: str, group: str, topic: str, mode: str) -> None:
    """Run the member until killed."""
    transport = create_transport(test_settings(), transport_name)
    await run_member(transport, group, topic, mode, int(os.environ.get("EXPECT", "0")), emit)


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:5]))
