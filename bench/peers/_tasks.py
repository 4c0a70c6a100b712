"""Shared by the peers of bench/peers_bench.py: configuration, the payload, pacing, the records.

Every peer runs as ``<script> worker`` (consume until killed) or ``<script> enqueue --count N
--rate R --start S`` (enqueue tasks ``S..S+N-1``, at ``R`` per second or, with ``R`` 0, as fast
as the client goes, in concurrent windows). The broker, queue and record file come from the
environment: ``PEER_URL`` (Redis URL or Kafka bootstrap servers), ``PEER_QUEUE`` and
``PEER_RECORD``.

A task carries its sequence number, its enqueue time and 1,000 bytes of padding (about 1 KiB in
all). The handler's only work is :func:`record`: one 24-byte record (sequence, enqueue time,
handler start time) appended to the record file with a single ``O_APPEND`` write, which is
atomic, so every process of a multi-process worker can share the file. Times come from the
monotonic clock, which all processes of the machine share. The harness runs our own worker with
the same record, so the handler costs the same everywhere.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import struct
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

RECORD = struct.Struct("<qdd")
HEADER = struct.Struct("<qd")
PAD = "x" * 1000
WINDOW = 500

URL = os.environ.get("PEER_URL", "")
QUEUE = os.environ.get("PEER_QUEUE", "")
RECORD_PATH = os.environ.get("PEER_RECORD", "")


class _Recorder:
    """Appends records to ``PEER_RECORD``; reopens the file in each (forked) process."""

    def __init__(self) -> None:
        self._fd = -1
        self._pid = -1

    def __call__(self, seq: int, enqueued: float) -> None:
        started = time.monotonic()
        if self._pid != os.getpid():
            self._fd = os.open(RECORD_PATH, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            self._pid = os.getpid()
        os.write(self._fd, RECORD.pack(seq, enqueued, started))


record = _Recorder()


def payload(seq: int, enqueued: float) -> bytes:
    """A ~1 KiB message body for the stream peers: sequence, enqueue time, padding."""
    return HEADER.pack(seq, enqueued) + PAD.encode()


def unpack(body: bytes) -> tuple[int, float]:
    """(sequence, enqueue time) of a :func:`payload` body."""
    seq, enqueued = HEADER.unpack_from(body)
    return int(seq), float(enqueued)


def role() -> argparse.Namespace:
    """The command line: ``worker`` or ``enqueue --count --rate --start``."""
    parser = argparse.ArgumentParser()
    parser.add_argument("role", choices=["worker", "enqueue"])
    parser.add_argument("--count", type=int, default=0)
    parser.add_argument("--rate", type=float, default=0.0)
    parser.add_argument("--start", type=int, default=0)
    return parser.parse_args()


async def paced(
    args: argparse.Namespace, enqueue: Callable[[int, float], Awaitable[object]]
) -> None:
    """Call ``enqueue(seq, now)`` for every task: paced at ``--rate``, else in windows."""
    seqs = range(args.start, args.start + args.count)
    if args.rate <= 0:
        for i in range(0, len(seqs), WINDOW):
            await asyncio.gather(*(enqueue(s, time.monotonic()) for s in seqs[i : i + WINDOW]))
        return
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    pending: set[asyncio.Future[object]] = set()
    for i, seq in enumerate(seqs):
        delay = t0 + i / args.rate - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        task = asyncio.ensure_future(enqueue(seq, time.monotonic()))
        pending.add(task)
        task.add_done_callback(pending.discard)
    while pending:
        await asyncio.gather(*list(pending))


def paced_sync(args: argparse.Namespace, enqueue: Callable[[int, float], object]) -> None:
    """:func:`paced` for a blocking client."""
    t0 = time.monotonic()
    for i, seq in enumerate(range(args.start, args.start + args.count)):
        if args.rate > 0:
            delay = t0 + i / args.rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
        enqueue(seq, time.monotonic())
