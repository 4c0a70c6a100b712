"""A serving process's heap: its start-up objects set aside, its freed C heap handed back.

A long-running process (``pipeline consume``, ``pipeline ingress serve``, the span exporter of
:mod:`pipeline.tracing.export`) imports its libraries and builds its clients once: by the time
it serves, the interpreter holds about 100,000 objects that live as long as the process.
CPython's full collection (generation 2) walks every tracked object each time it runs, and it
runs again and again while messages flow, because the objects of in-flight messages keep
reaching the oldest generation. Each of those passes then re-walks the start-up objects: in
``pipeline consume`` about 3 µs of every message's CPU on average, and a pause of about 40 ms
whenever a pass runs, which lands in the latency tail.

:func:`freeze_startup` collects once and then moves every object alive into the permanent
generation (``gc.freeze``), which the collector never walks: full passes see only what was made
while serving. An object frozen here is never freed by the cyclic collector, so it is called
once, when start-up is over (garbage made before it is collected first); objects freed by
reference counting are freed as always.

:func:`keep_trimmed` hands the C heap's free pages back to the system. glibc keeps what a burst
freed: five floods of 100,000 distinct keys into ``pipeline consume`` left its resident set
+41 to +72 MB above the warm-up with the live heap flat (22-25 MiB in use), the rest free but
kept; an ingress's lag reads, each on a short-lived thread, left arenas the same way.
``malloc_trim(0)`` gives every arena's free pages back, but it is not free: it walks every free
chunk, 5-100 ms on a fragmented heap of 50-200 MiB, and holds each arena's lock meanwhile, so a
``malloc`` of the event loop waits for it even though it runs on a worker thread (a ctypes call
releases the GIL). So it runs only once the process has gone quiet after activity, at most every
:data:`TRIM_MIN_INTERVAL_S`; under a steady flow glibc reuses what it keeps. Where the C library
has no ``malloc_trim`` (musl, macOS) nothing runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import gc
import logging
import time
from collections.abc import Callable
from typing import Protocol

log = logging.getLogger(__name__)

__all__ = ["TRIM_CHECK_S", "TRIM_MIN_INTERVAL_S", "HeapTrim", "heap_trim", "keep_trimmed"]

TRIM_CHECK_S = 5.0
"""How often :func:`keep_trimmed` looks at the activity: a process quiet for this long after
activity is trimmed."""

TRIM_MIN_INTERVAL_S = 30.0
"""The least time between two trims (a trickle of work is quiet between most of its messages)."""


class HeapTrim(Protocol):
    """Hands free heap pages back to the system; whether any were (``malloc_trim``'s answer)."""

    def __call__(self, pad: int, /) -> int:
        """Keep ``pad`` bytes at the top of the main heap; 1 if pages went back, else 0."""
        ...


class _Loader(Protocol):
    """Opens a shared library by name (``ctypes.CDLL``); raises OSError where there is none."""

    def __call__(self, name: str | None, /) -> object:
        """The library ``name`` (None: the process itself)."""
        ...


def heap_trim(loader: _Loader = ctypes.CDLL) -> HeapTrim | None:
    """The C library's ``malloc_trim``, or None where it has none (not glibc).

    Looked up in the process itself (``dlopen(NULL)``), which has the C library loaded:
    ``ctypes.util.find_library`` would start ``ldconfig`` at every start to find its name.
    """
    try:
        libc = loader(None)
    except OSError:
        return None
    trim = getattr(libc, "malloc_trim", None)
    if trim is None:
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    found: HeapTrim = trim
    return found


def freeze_startup() -> int:
    """Collect, then exempt every object alive now from later collections; how many."""
    gc.collect()
    gc.freeze()
    frozen = gc.get_freeze_count()
    log.debug("start-up objects set aside from garbage collection: %d", frozen)
    return frozen


async def keep_trimmed(
    activity: Callable[[], int],
    stop: asyncio.Event,
    trim: HeapTrim | None,
    *,
    check_s: float = TRIM_CHECK_S,
    min_interval_s: float = TRIM_MIN_INTERVAL_S,
) -> int:
    """Trim the C heap once after each busy spell until ``stop``; how many trims ran.

    ``activity()`` is a count that moves while the process works (messages delivered, requests
    answered). Every ``check_s`` it is read: a count that moved since the last trim and stood
    still since the previous read is trimmed for, if ``min_interval_s`` passed since the last
    trim. A count that has not moved since the last trim is not (nothing new was freed).
    ``trim`` is :func:`heap_trim`'s; None (no ``malloc_trim`` here) returns at once.
    """
    if trim is None:
        log.debug("no malloc_trim in this C library: the heap is not trimmed")
        return 0
    trims = 0
    trimmed_at, trimmed_count = time.monotonic(), activity()
    seen = trimmed_count
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), check_s)
        if stop.is_set():
            break
        count, before = activity(), seen
        seen = count
        if count != before or count == trimmed_count:
            continue  # still working, or nothing done since the last trim
        if time.monotonic() - trimmed_at < min_interval_s:
            continue
        await _trim_once(trim)
        trims += 1
        trimmed_at, trimmed_count = time.monotonic(), count
    return trims


async def _trim_once(trim: HeapTrim) -> None:
    """One ``malloc_trim(0)`` on a worker thread, its duration logged at DEBUG."""
    started = time.perf_counter()
    released = await asyncio.to_thread(trim, 0)
    log.debug(
        "C heap trimmed in %.1f ms (%s)",
        (time.perf_counter() - started) * 1000,
        "pages handed back" if released else "nothing to hand back",
    )
