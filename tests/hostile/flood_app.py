"""An app of two lanes for a flood of distinct keys, tenants and conversations (by hand).

``FLOOD_UNIQUE`` names the lanes: ``flood_thr_UNIQUE`` is throttled per tenant
(``org:{tenant}``), ordered, with a retry tier, and a fifth of its messages fail once;
``flood_deb_UNIQUE`` is debounced per conversation, with a retry tier. ``flood_rss.py``
measures a ``pipeline consume`` process of it; with ``FLOOD_PROBE`` (a file's path) set, the
process answers SIGUSR2 with figures of its heap and objects (:func:`_probe`).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import json
import os
import signal
import sys
import tracemalloc
from collections import Counter
from pathlib import Path

from pipeline.errors import Retry
from pipeline.runtime import App, Context
from pipeline.topics.spec import TopicSpec

UNIQUE = os.environ["FLOOD_UNIQUE"]
THROTTLED = TopicSpec.model_validate(
    {
        "name": f"flood_thr_{UNIQUE}",
        "partitions": 3,
        "throttle": {"keys": ["org:{tenant}"]},
        "retry": {"tiers": ["100ms"], "max_attempts": 3},
    }
)
DEBOUNCED = TopicSpec.model_validate(
    {
        "name": f"flood_deb_{UNIQUE}",
        "partitions": 3,
        "debounce": {"key": "conversation_id", "quiet_s": 0.1, "max_wait_s": 1},
        "retry": {"tiers": ["100ms"], "max_attempts": 3},
    }
)
app = App([THROTTLED, DEBOUNCED])


@app.handler(THROTTLED.lane)
async def handle(event: bytes, ctx: Context) -> None:
    """A fifth of the messages fail once: their keys park, their copies run from the tier."""
    if json.loads(event)["n"] % 5 == 0 and ctx.attempt == 1:
        raise Retry("once, to park the key and retry it")


@app.handler(DEBOUNCED.lane)
async def turn(events: list[bytes], ctx: Context) -> None:
    """Nothing: the turn is the point."""


def _probe(_signum: int, _frame: object) -> None:
    """Answer ``flood_rss.py``'s request (SIGUSR2): the command in ``FLOOD_PROBE``, figures out.

    ``stats``: allocated blocks, C heap (``mallinfo2``), GC-tracked objects by type and, while
    tracing, the allocation sites grown since the last ``stats``; ``trace``: start tracing;
    ``trim``: collect cycles and hand the C heap's free pages back (``malloc_trim``).
    """
    path = Path(os.environ["FLOOD_PROBE"])
    command = path.read_text().strip()
    out: dict[str, object] = {"command": command}
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    if command == "trace":
        tracemalloc.start(int(os.environ.get("FLOOD_TRACE_FRAMES", "1")))
        _snapshots.append(tracemalloc.take_snapshot())
    elif command == "trim":
        out["collected"] = gc.collect()
        out["trimmed"] = libc.malloc_trim(0)
    else:
        libc.mallinfo2.restype = _MallInfo2
        info = libc.mallinfo2()
        out["blocks"] = sys.getallocatedblocks()
        fields = ("arena", "hblkhd", "uordblks", "fordblks", "keepcost")
        out["heap"] = {name: getattr(info, name) for name in fields}
        out["types"] = Counter(type(o).__qualname__ for o in gc.get_objects())
        if tracemalloc.is_tracing():
            snapshot = tracemalloc.take_snapshot()
            grown = snapshot.compare_to(_snapshots[-1], "lineno")[:15]
            out["sites"] = [(str(s.traceback), s.size_diff, s.count_diff) for s in grown]
            out["traced"] = tracemalloc.get_traced_memory()[0]
            out["tracing"] = tracemalloc.get_tracemalloc_memory()
            _snapshots[-1:] = [snapshot]
    done = path.with_suffix(".tmp")
    done.write_text(json.dumps(out))
    done.rename(path.with_suffix(".json"))


class _MallInfo2(ctypes.Structure):
    """glibc's ``struct mallinfo2``: the C heap's figures."""

    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


_snapshots: list[tracemalloc.Snapshot] = []
if os.environ.get("FLOOD_PROBE"):
    signal.signal(signal.SIGUSR2, _probe)
