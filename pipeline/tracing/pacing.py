"""When the exporting process sends: in the traced process's pauses, within the schedule delay.

Encoding a delivery's spans costs the exporting process about 8 µs of CPU. It runs at idle
priority, so it never takes a core the traced process wants; but on hosts whose cores share
execution resources (the virtual CPUs of most cloud machines are threads of shared physical
cores), work on the *other* core still slows the traced process: on the two-vCPU benchmark host
an idle-priority busy loop on the other core made an untraced ``pipeline consume`` a quarter
slower, and exporting as records arrived cost the traced consumer more than its own tracing did
(docs/benchmarks.md, "Tracing"). Reading and keeping a batch costs under 1 µs a record.

So the exporting process keeps the batches that arrive while the traced process is busy
(:class:`CpuWatch`: it used at least :data:`BUSY_SHARE` of a core over the last
:data:`WINDOW_S`) and encodes them when it pauses; a burst's spans leave after the burst. A kept
batch never waits longer than ``OTEL_BSP_SCHEDULE_DELAY`` nor do kept batches exceed
:data:`KEPT_BYTES_MAX` (:class:`Backlog`), so under sustained load spans leave at the schedule
delay, as the SDK's batch processor would send them, and nothing is dropped here: while kept
batches pass :data:`KEPT_BYTES_MAX` (a collector slower than the input) nothing more is read, and
the traced process's bounded queue drops what does not fit (and counts it). At the end of its
input the process sends everything it keeps.
"""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

BUSY_SHARE = 0.5
"""The traced process is busy while it uses at least this share of one core."""
WINDOW_S = 0.1
"""How far back the traced process's CPU use is measured (``/proc`` counts in 10 ms ticks)."""
TICK_S = 0.02
"""How often kept batches are looked at again while no new one arrives."""
KEPT_BYTES_MAX = 64 * 1024 * 1024
"""Kept batches past this size are sent at once, busy or not, before anything more is read (a
memory bound)."""


def cpu_seconds_of(pid: int) -> Callable[[], float | None]:
    """A reader of the CPU time (user and system, every thread) process ``pid`` used so far.

    From ``/proc/<pid>/stat``; the reader returns None where that cannot be read (not Linux,
    the process gone).
    """
    path = Path(f"/proc/{pid}/stat")
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

    def read() -> float | None:
        try:
            fields = path.read_bytes().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            return None
        return (int(fields[11]) + int(fields[12])) / tick  # utime, stime (proc(5))

    return read


class CpuWatch:
    """Whether a process is busy: its share of one core over the last :data:`WINDOW_S`.

    Without a reading (``cpu_s`` gives None) it is never busy: batches are sent as they come.
    """

    __slots__ = ("_busy", "_cpu_s", "_from_cpu_s", "_from_s", "_window_s")

    def __init__(self, cpu_s: Callable[[], float | None], window_s: float = WINDOW_S) -> None:
        """Watch what ``cpu_s`` reads, measured over windows of ``window_s``."""
        self._cpu_s = cpu_s
        self._window_s = window_s
        self._from_s = float("-inf")  # the first call reads
        self._from_cpu_s: float | None = None
        self._busy = False

    def busy(self, now_s: float) -> bool:
        """Whether the process used at least :data:`BUSY_SHARE` of a core in the last window.

        ``now_s`` is ``time.monotonic()``; the verdict changes, and ``/proc`` is read, once a
        window has passed.
        """
        if now_s - self._from_s < self._window_s:
            return self._busy
        used_s = self._cpu_s()
        if used_s is None:
            self._busy = False
        elif self._from_cpu_s is not None:
            self._busy = used_s - self._from_cpu_s >= BUSY_SHARE * (now_s - self._from_s)
        self._from_s, self._from_cpu_s = now_s, used_s
        return self._busy


class Backlog:
    """Batches read and not yet sent, oldest first, with when each arrived."""

    __slots__ = ("_batches", "bytes", "delay_s", "max_bytes")

    def __init__(self, delay_s: float, max_bytes: int = KEPT_BYTES_MAX) -> None:
        """Batches wait at most ``delay_s`` and, together, hold at most ``max_bytes``."""
        self._batches: deque[tuple[float, bytes]] = deque()
        self.delay_s = delay_s
        self.max_bytes = max_bytes
        self.bytes = 0

    def __len__(self) -> int:
        """How many batches wait."""
        return len(self._batches)

    def add(self, body: bytes, now_s: float) -> None:
        """Keep one batch that arrived at ``now_s``."""
        self._batches.append((now_s, body))
        self.bytes += len(body)

    def due(self, now_s: float, busy: bool) -> bool:
        """Whether the oldest batch is to be sent now.

        Yes when the traced process is not ``busy``, when the batch has waited ``delay_s``, or
        when the batches kept pass ``max_bytes``.
        """
        if not self._batches:
            return False
        return (
            not busy or now_s - self._batches[0][0] >= self.delay_s or self.bytes > self.max_bytes
        )

    def pop(self) -> bytes:
        """The oldest batch, no longer kept."""
        _arrived, body = self._batches.popleft()
        self.bytes -= len(body)
        return body


class Frames(Protocol):
    """Where batches come from (:class:`.framing.FrameReader`)."""

    def read(self, timeout_s: float | None) -> list[bytes] | None:
        """The batches that arrived within ``timeout_s`` (None: wait); None at the end."""
        ...


def paced(
    reader: Frames,
    backlog: Backlog,
    busy: Callable[[float], bool],
    send: Callable[[bytes], None],
    clock: Callable[[], float] = time.monotonic,
) -> None:
    """Read batches until the input ends, sending each when :meth:`Backlog.due`; then the rest.

    One batch is sent between two reads, so a batch that arrives while kept ones are being sent
    is read (and timed) at once; past the backlog's size bound, kept batches are sent without
    reading more (what arrives waits in the pipe, then in the traced process's bounded queue).
    """
    while True:
        if backlog.bytes > backlog.max_bytes:  # the collector is slower than the input
            send(backlog.pop())
            continue
        now_s = clock()
        due = backlog.due(now_s, busy(now_s))
        bodies = reader.read(0 if due else (TICK_S if backlog else None))
        if bodies is None:
            break
        arrived_s = clock()
        for body in bodies:
            backlog.add(body, arrived_s)
        if due:
            send(backlog.pop())
    while backlog:
        send(backlog.pop())
