"""The app module the process benchmarks run, with ``pipeline consume`` or as a bare member.

``bench/lane_process.py`` copies this file into a fresh directory beside a ``topics/`` directory
holding the lane's yaml, and starts the consumer with that directory as its working directory,
so ``pipeline consume bench_lane_app:app --group G`` imports it exactly as a user's app. It is
configured by the environment:

* ``BENCH_LANE``: the lane to serve.
* ``BENCH_MODE``:

  - ``count`` (default): a no-op handler that writes one byte per message to the file
    descriptor ``BENCH_OUT_FD`` (a pipe the harness reads and counts); with
    ``BENCH_COUNT_EVERY`` N > 1 it keeps the bytes and writes N at a time, so the harness's
    reader is woken once per N messages (N must divide the messages the harness waits for);
  - ``checked``: the same byte, written once per message on its first success, plus in-process
    checks: two runs of one key at the same time (``key_overlaps``: a dict of keys running, exact
    within one process), a success after a later message of its key (``order_violations``,
    from the produce sequence in the value's first 8 bytes), repeated successes
    (``duplicates``), and how late each retry copy's handler started after its due time (the
    ``pl-due-ms`` header), summed up at exit as ``retry_late_ms_p50``, ``_p90`` and ``_max``;
    with ``BENCH_FAIL_MODULO`` M > 0, a message whose ``crc32(value) % M == 0``
    is chosen on its first attempt, and fails (``injected_failures``) unless ``BENCH_INJECT`` is
    ``0``: a run without failures then makes the same choice, so both runs' handlers do the
    same work but for the raise. The handler holds its key for
    ``BENCH_HOLD_MS`` (default 1 ms) so a second run of the key has a window to overlap;
  - ``record``: ``bench/peers/_tasks.py``'s 24-byte record per task (the peers' handler);
  - ``e2e``: per webhook, a :data:`E2E` record (sequence, 1 if its event id ends in
    ``.<BENCH_TAG>.<seq>`` else 0 for a warm-up one, handler start on the monotonic clock)
    appended to the file ``BENCH_RECORDS``.

* ``BENCH_STATS``: where the checked counters are written as JSON when the process exits.
"""

from __future__ import annotations

import asyncio
import atexit
import json
import os
import struct
import time
import zlib
from pathlib import Path

from pipeline.headers import DUE_MS
from pipeline.runtime import App, Context

app = App("topics")
LANE = os.environ.get("BENCH_LANE", "bench")
MODE = os.environ.get("BENCH_MODE", "count")
OUT_FD = int(os.environ.get("BENCH_OUT_FD", "-1"))
COUNT_EVERY = max(1, int(os.environ.get("BENCH_COUNT_EVERY", "1")))
FAIL_MODULO = int(os.environ.get("BENCH_FAIL_MODULO", "0"))
INJECT = os.environ.get("BENCH_INJECT", "1") != "0"
HOLD_S = float(os.environ.get("BENCH_HOLD_MS", "1")) / 1000
STATS_PATH = os.environ.get("BENCH_STATS", "")
E2E = struct.Struct("<qqd")

stats: dict[str, float] = {
    "successes": 0,
    "injected_failures": 0,
    "key_overlaps": 0,
    "order_violations": 0,
    "duplicates": 0,
}
_running: dict[bytes, int] = {}
_top: dict[bytes, int] = {}
_done: set[int] = set()
_late_ms: list[float] = []


def _dump() -> None:
    if _late_ms:
        _late_ms.sort()
        stats["retry_late_ms_p50"] = round(_late_ms[len(_late_ms) // 2], 1)
        stats["retry_late_ms_p90"] = round(_late_ms[int(len(_late_ms) * 0.9)], 1)
        stats["retry_late_ms_max"] = round(_late_ms[-1], 1)
    if STATS_PATH:
        Path(STATS_PATH).write_text(json.dumps(stats), encoding="utf-8")


if MODE == "count" and COUNT_EVERY > 1:
    _kept = [0]
    _BYTES = b"." * COUNT_EVERY

    @app.handler(LANE)
    async def count(_event: bytes, _ctx: Context) -> None:
        """One byte per message to the harness's pipe, written ``COUNT_EVERY`` at a time."""
        _kept[0] += 1
        if _kept[0] == COUNT_EVERY:
            _kept[0] = 0
            os.write(OUT_FD, _BYTES)

elif MODE == "count":

    @app.handler(LANE)
    async def count(_event: bytes, _ctx: Context) -> None:
        """One byte per message to the harness's pipe."""
        os.write(OUT_FD, b".")

elif MODE == "checked":
    atexit.register(_dump)

    @app.handler(LANE)
    async def checked(event: bytes, ctx: Context) -> None:
        """Hold the key a moment, fail the chosen messages once, check order and overlaps."""
        key = ctx.message.key or b""
        due = ctx.message.headers.get(DUE_MS)
        if due is not None:
            _late_ms.append(time.time() * 1000 - int(due))
        if _running.get(key):
            stats["key_overlaps"] += 1
        _running[key] = _running.get(key, 0) + 1
        try:
            await asyncio.sleep(HOLD_S)
            chosen = FAIL_MODULO and ctx.attempt == 1 and zlib.crc32(event) % FAIL_MODULO == 0
            if chosen and INJECT:
                stats["injected_failures"] += 1
                raise RuntimeError("injected failure (attempt 1)")
            seq = int(event[:8])
            if seq < _top.get(key, -1):
                stats["order_violations"] += 1
            _top[key] = max(seq, _top.get(key, -1))
            stats["successes"] += 1
            if seq in _done:
                stats["duplicates"] += 1
                return
            _done.add(seq)
            os.write(OUT_FD, b".")
        finally:
            _running[key] -= 1

elif MODE == "record":
    from _tasks import record, unpack  # bench/peers on PYTHONPATH

    @app.handler(LANE)
    async def recorded(event: bytes, _ctx: Context) -> None:
        """The peers' handler: one 24-byte record per task."""
        record(*unpack(event))

elif MODE == "e2e":
    _TAG = os.environ.get("BENCH_TAG", "")
    _RECORDS = os.open(os.environ["BENCH_RECORDS"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    @app.handler(LANE)
    async def timed(_event: bytes, ctx: Context) -> None:
        """One record of when the webhook's handler started."""
        started = time.monotonic()
        run, _, seq = (ctx.event_id or "").rpartition(".")
        os.write(_RECORDS, E2E.pack(int(seq), run.endswith(f".{_TAG}"), started))
