"""Scale-in protection: a member busy with long work asks not to be the one removed.

Each tick the member counts its runs of long-work lanes (``heartbeat_timeout``) that started
less than ``runtime.protect_max_s`` ago and publishes the count: as its Pod's
``controller.kubernetes.io/pod-deletion-cost`` in Kubernetes
(:class:`~pipeline.observability.deletion_cost.DeletionCost`: only its own Pod, rate-limited),
and always as the ``pipeline_long_work_running`` gauge. A scale-in then removes idle members
first. The protection lapses on its own: a run stops counting after ``protect_max_s`` (a stuck
handler cannot keep its Pod forever), a member that stops sets its cost back to 0, and one
that died and restarts starts from 0.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Protocol


class CostSink(Protocol):
    """Where the count goes in Kubernetes (:class:`DeletionCost`)."""

    async def update(self, in_flight: int, *, force: bool = False) -> bool:
        """Publish ``in_flight`` (rate-limited unless ``force``); True when it was sent."""
        ...

    async def close(self) -> None:
        """Release the client."""
        ...


class GaugeSink(Protocol):
    """Where the count goes as a metric (:class:`RuntimeMetrics`)."""

    def long_work(self, running: int) -> None:
        """Set the gauge."""
        ...


class ScaleInProtection:
    """Publishes how many long runs a member protects (see the module docstring)."""

    def __init__(self, cost: CostSink | None, gauge: GaugeSink | None, *, max_s: float) -> None:
        """Publish to ``cost`` (None outside Kubernetes) and ``gauge``.

        A run counts for ``max_s`` seconds after it started, no longer.
        """
        self._cost = cost
        self._gauge = gauge
        self._max_s = max_s
        self.protected = 0
        """The count published last."""

    async def update(self, started_s: Iterable[float], now_s: float | None = None) -> None:
        """Publish the runs of ``started_s`` (monotonic start times) younger than the bound."""
        now = time.monotonic() if now_s is None else now_s
        self.protected = sum(1 for s in started_s if now - s < self._max_s)
        if self._gauge is not None:
            self._gauge.long_work(self.protected)
        if self._cost is not None:
            await self._cost.update(self.protected)

    async def close(self) -> None:
        """The member stops: no protection is left behind."""
        self.protected = 0
        if self._gauge is not None:
            self._gauge.long_work(0)
        if self._cost is not None:
            await self._cost.update(0, force=True)
            await self._cost.close()
