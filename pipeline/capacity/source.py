"""The ``/metrics`` source that exports each lane's forecast and desired member count.

:class:`CapacitySource` is a :class:`~pipeline.observability.sources.SnapshotSource`: the
metrics refresher calls it in the background (never a scrape), it plans every declared lane
(:func:`~pipeline.capacity.plan.plan_lane`, two small Redis reads per lane) and sets
``pipeline_forecast_arrivals_per_second``, ``pipeline_desired_members`` and
``pipeline_service_time_seconds``, which the consumer groups' KEDA ScaledObjects read (the last
sizes a backlog in their slot trigger, :mod:`pipeline.capacity.triggers`).

:class:`ServiceTimeSource` runs in a consumer-group member: it reads what the member's own
``pipeline_handler_duration_seconds{outcome="handled"}`` gained since its last refresh (from the
registry, so the hot path pays nothing) and records it as the lane's service time.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from pipeline.capacity.history import ArrivalHistory
from pipeline.capacity.plan import LanePlan, plan_lane
from pipeline.capacity.recorder import ArrivalRecorder
from pipeline.capacity.settings import CapacitySettings
from pipeline.observability.facades import CapacityMetrics
from pipeline.observability.metrics import DEBOUNCE_TURN_MESSAGES, HANDLER_DURATION, Metrics

__all__ = ["CapacitySource", "ServiceTimeSource"]


class CapacitySource:
    """Plans ``lanes`` at every refresh and writes the two capacity gauges."""

    name = "capacity"

    def __init__(
        self,
        history: ArrivalHistory,
        lanes: Sequence[str],
        settings: CapacitySettings,
        metrics: CapacityMetrics,
        *,
        slots_per_member: int,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """Read ``history`` for ``lanes``; size members of ``slots_per_member`` slots."""
        self._history = history
        self._lanes = sorted(set(lanes))
        self._settings = settings
        self._metrics = metrics
        self._slots = slots_per_member
        self._clock = clock
        self.plans: list[LanePlan] = []
        """What the last refresh planned."""

    async def refresh(self) -> None:
        """Plan every lane and update the gauges (a Redis error fails the whole refresh)."""
        now_s = self._clock()
        plans = [
            await plan_lane(
                self._history, lane, self._settings, slots_per_member=self._slots, now_s=now_s
            )
            for lane in self._lanes
        ]
        for plan in plans:
            self._metrics.planned(
                plan.lane, plan.planned_per_s, plan.desired_members, plan.service_s
            )
        self.plans = plans


class ServiceTimeSource:
    """Copies a member's handled-message durations into the lanes' service-time history.

    Arrivals are counted per message, so the service time must be per message too. On a
    debounced lane one handler call runs a whole turn of several messages: its handled calls are
    multiplied by the mean messages per turn the lane's turns received in the same interval
    (``pipeline_debounce_turn_messages``), so the recorded time is per message. A turn is
    counted when it starts and its call when it ends: an interval whose calls belong to turns
    that started before it uses the mean messages per turn since the member started.
    """

    name = "service_time"

    def __init__(self, metrics: Metrics, recorder: ArrivalRecorder, lanes: Sequence[str]) -> None:
        """Read ``metrics`` (the member's registry) for ``lanes``; record with ``recorder``."""
        self._registry = metrics.registry
        self._recorder = recorder
        self._lanes = sorted(set(lanes))
        self._seen: dict[str, tuple[float, float, float, float]] = {}

    def _sample(self, name: str, labels: dict[str, str]) -> float:
        return self._registry.get_sample_value(name, labels) or 0.0

    async def refresh(self) -> None:
        """Record the handled count and seconds each lane gained, then flush (one round trip)."""
        for lane in self._lanes:
            labels = {"lane": lane, "outcome": "handled"}
            count = self._registry.get_sample_value(f"{HANDLER_DURATION.name}_count", labels)
            total_s = self._registry.get_sample_value(f"{HANDLER_DURATION.name}_sum", labels)
            if count is None or total_s is None:
                continue
            turns = self._sample(f"{DEBOUNCE_TURN_MESSAGES.name}_count", {"lane": lane})
            messages = self._sample(f"{DEBOUNCE_TURN_MESSAGES.name}_sum", {"lane": lane})
            last = self._seen.get(lane, (0.0, 0.0, 0.0, 0.0))
            self._seen[lane] = (count, total_s, turns, messages)
            calls, new_turns = count - last[0], turns - last[2]
            if new_turns > 0:
                per_call = (messages - last[3]) / new_turns
            else:  # calls of turns that started before the last refresh: the mean so far
                per_call = messages / turns if turns > 0 else 1.0
            self._recorder.served(lane, round(calls * max(per_call, 1.0)), total_s - last[1])
        await self._recorder.flush()
