"""The app module ``bench/tenant_flood.py`` runs with ``pipeline consume``.

The harness copies this file into a fresh directory beside ``topics/<lane>.yaml`` and starts
``pipeline consume tenant_flood_app:app`` there, so the lane is imported as a user's app is.
Configured by the environment:

* ``BENCH_LANE``: the lane to serve.
* ``BENCH_OUT_FD``: the write end of a pipe; per message handled, one :data:`RECORD` goes to it.
* ``BENCH_HANDLER_MS``: how long the handler holds its slot (an ``asyncio.sleep``, default 20).

A message's value starts with :data:`HEAD`: its class (``W`` warm-up, ``S`` small tenant, ``F``
flood), its sequence number within the class and its produce time (``time.time()``), followed
by padding. The record carries the same three and the handler's start time, so the harness reads
each message's wait (produce time to handler start) without a clock of its own in here.
"""

from __future__ import annotations

import asyncio
import os
import struct
import time

from pipeline.runtime import App, Context

HEAD = struct.Struct("<cqd")
"""Class, sequence, produce time: the start of every value."""
RECORD = struct.Struct("<cqdd")
"""Class, sequence, produce time, handler start: one per message handled (25 bytes, so each
``os.write`` to the pipe is atomic)."""

app = App("topics")
LANE = os.environ.get("BENCH_LANE", "tenant_flood")
OUT_FD = int(os.environ.get("BENCH_OUT_FD", "-1"))
HOLD_S = float(os.environ.get("BENCH_HANDLER_MS", "20")) / 1000


@app.handler(LANE)
async def handle(event: bytes, _ctx: Context) -> None:
    """Note the start, hold the slot for ``BENCH_HANDLER_MS``, then write the record."""
    start = time.time()
    kind, seq, produced = HEAD.unpack_from(event)
    await asyncio.sleep(HOLD_S)
    os.write(OUT_FD, RECORD.pack(kind, seq, produced, start))
