"""A member's concurrency shrinks under memory or CPU pressure and grows back when it passes.

Every ``interval_s`` the member reads how pressed its host (or container) is: Linux pressure
stall information (PSI, the share of the last ten seconds in which some task waited for CPU or
memory) and the memory in use against the limit (the cgroup's, else the machine's). Under
pressure it lowers the number of handlers it runs at once multiplicatively (AIMD: a quarter
less per sample, down to ``min_concurrency``); once every reading is back under its threshold it
raises it by one per sample, up to ``max_concurrency``. Work it does not start waits in the
member's queues and flow control pauses fetching, so a member that is running out of memory
takes less in instead of being OOM-killed with a full queue in flight.

Where a reading is unavailable (no PSI on the kernel, no cgroup files) it is ignored.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from pipeline.config import PressureSettings

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Pressure:
    """One reading; None where the host does not tell."""

    cpu_psi: float | None = None
    """PSI ``some avg10`` of CPU, percent."""
    memory_psi: float | None = None
    """PSI ``some avg10`` of memory, percent."""
    memory_used: float | None = None
    """Memory in use as a fraction of the limit."""


class PressureProbe(Protocol):
    """Where readings come from."""

    def read(self) -> Pressure:
        """Read the current pressure."""
        ...


def parse_psi(text: str) -> float | None:
    """The ``some avg10`` value of a PSI file's text (``some avg10=1.23 avg60=...``)."""
    for line in text.splitlines():
        fields = line.split()
        if fields and fields[0] == "some":
            for field in fields[1:]:
                name, _, value = field.partition("=")
                if name == "avg10":
                    return float(value)
    return None


class LinuxProbe:
    """PSI from the cgroup (v2) or the whole host, memory from the cgroup (v2 or v1) or host."""

    def __init__(self, root: Path = Path("/")) -> None:
        """Read the files under ``root`` (``/``, or a copy of the tree in tests)."""
        cgroup = root / "sys/fs/cgroup"
        self._cpu_psi = _first(cgroup / "cpu.pressure", root / "proc/pressure/cpu")
        self._memory_psi = _first(cgroup / "memory.pressure", root / "proc/pressure/memory")
        v2 = (cgroup / "memory.current", cgroup / "memory.max")
        v1 = (cgroup / "memory/memory.usage_in_bytes", cgroup / "memory/memory.limit_in_bytes")
        self._memory = v2 if v2[0].exists() else v1 if v1[0].exists() else None
        self._meminfo_path = root / "proc/meminfo"

    def read(self) -> Pressure:
        """Read PSI and memory use once (a few small file reads)."""
        return Pressure(
            cpu_psi=_psi(self._cpu_psi),
            memory_psi=_psi(self._memory_psi),
            memory_used=self._memory_used(),
        )

    def _memory_used(self) -> float | None:
        total, available = self._meminfo()
        if self._memory is not None:
            try:
                used = int(self._memory[0].read_text())
                raw_limit = self._memory[1].read_text().strip()
            except (OSError, ValueError):
                return None
            limit = int(raw_limit) if raw_limit != "max" else total
            if total is not None and limit is not None:
                limit = min(limit, total)  # v1 says "no limit" with a huge number
            return used / limit if limit else None
        if total and available is not None:
            return 1 - available / total
        return None

    def _meminfo(self) -> tuple[int | None, int | None]:
        """MemTotal and MemAvailable of the host, in bytes."""
        try:
            text = self._meminfo_path.read_text()
        except OSError:
            return None, None
        values = {}
        for line in text.splitlines():
            name, _, rest = line.partition(":")
            fields = rest.split()
            if fields and fields[0].isdigit():
                values[name] = int(fields[0]) * 1024
        return values.get("MemTotal"), values.get("MemAvailable")


def _first(*paths: Path) -> Path | None:
    return next((p for p in paths if p.exists()), None)


def _psi(path: Path | None) -> float | None:
    if path is None:
        return None
    try:
        return parse_psi(path.read_text())
    except (OSError, ValueError):
        return None


class ConcurrencyGovernor:
    """AIMD on a member's concurrency limit, driven by pressure readings."""

    def __init__(
        self,
        settings: PressureSettings,
        maximum: int,
        apply: Callable[[int], None],
        probe: PressureProbe | None = None,
    ) -> None:
        """Govern a limit between the settings' floor and ``maximum``; ``apply`` sets it."""
        self._settings = settings
        self._maximum = maximum
        self._minimum = max(1, min(maximum, settings.min_concurrency))
        self._apply = apply
        self._probe = probe or LinuxProbe()
        self.limit = maximum
        self.pressed: list[str] = []
        """What was over its threshold at the last reading (for logs and metrics)."""

    def over(self, reading: Pressure) -> list[str]:
        """The readings over their thresholds."""
        s = self._settings
        checks = (
            ("cpu", reading.cpu_psi, s.cpu_psi),
            ("memory", reading.memory_psi, s.memory_psi),
            ("memory_used", reading.memory_used, s.memory_used),
        )
        return [name for name, value, high in checks if value is not None and value >= high]

    def step(self, reading: Pressure) -> int:
        """Take one reading into account; returns the new limit (also applied)."""
        self.pressed = self.over(reading)
        before = self.limit
        if self.pressed:
            self.limit = max(self._minimum, math.floor(self.limit * 0.75))
        else:
            self.limit = min(self._maximum, self.limit + 1)
        if self.limit != before:
            self._apply(self.limit)
            if self.pressed or self.limit == self._maximum:
                log.info(
                    "concurrency %d -> %d (pressure: %s)",
                    before,
                    self.limit,
                    ", ".join(self.pressed) or "none",
                )
        return self.limit

    async def run(self, stop: asyncio.Event) -> None:
        """Read and step every ``interval_s`` until ``stop`` is set."""
        while not stop.is_set():
            try:
                self.step(self._probe.read())
            except Exception:  # a probe failure must never stop the member
                log.exception("pressure reading failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self._settings.interval_s)
