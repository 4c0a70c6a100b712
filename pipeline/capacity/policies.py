"""The scaling policies the simulation compares, and the week it compares them on.

- :class:`LagPolicy`: reactive on consumer lag (messages not yet finished), one member per
  ``lag_per_member`` of them, as a KEDA lag trigger does.
- :class:`UtilisationPolicy`: reactive on busy slots, so each member is ``target`` busy (the
  manifests' ``pipeline_worker_slots_busy`` trigger).
- :class:`PredictivePolicy`: the utilisation policy plus the members a backlog needs, but never
  below the members the seasonal forecast (:mod:`pipeline.capacity.forecast`) of the next
  ``lookahead_min`` minutes needs by Little's law: the manifests' slot trigger (busy slots plus
  the members the backlog needs, computed in its query by :mod:`pipeline.capacity.triggers`)
  beside their ``pipeline_desired_members`` trigger.

:func:`week_rates` draws the simulated week: weekday peaks in the late morning and the
afternoon, quiet nights and weekends, minute-level noise, and one unannounced spike.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field

from pipeline.capacity.forecast import seasonal_forecast
from pipeline.capacity.queueing import backlog_members, members_for
from pipeline.capacity.simulation import Fleet, Observation

__all__ = [
    "MINUTES_PER_WEEK",
    "LagPolicy",
    "PredictivePolicy",
    "Spike",
    "UtilisationPolicy",
    "history_counts",
    "week_rates",
]

MINUTES_PER_WEEK = 7 * 1440
WEEKDAY_FACTOR = (1.0, 0.95, 1.0, 0.9, 0.85, 0.45, 0.35)
"""Monday to Sunday."""


@dataclass(frozen=True, slots=True)
class Spike:
    """A one-off surge: ``factor`` times the usual rate for ``minutes`` from ``at_minute``."""

    at_minute: int
    minutes: int
    factor: float


def week_rates(
    peak_per_s: float,
    *,
    seed: int,
    noise: float = 0.08,
    spike: Spike | None = None,
    opening_min: float = 25.0,
) -> list[float]:
    """Arrivals per second for each minute of a week (Monday 00:00 first).

    Weekdays open at 08:30, rising from 10 % to 90 % of the peak in ``opening_min`` minutes.
    """
    rng = random.Random(seed)
    rates = []
    level = 0.0
    for minute in range(MINUTES_PER_WEEK):
        day, hour = divmod(minute / 60.0, 24.0)
        daily = 0.12 + 0.88 * _business_hours(hour, opening_min)
        level = 0.9 * level + rng.gauss(0.0, noise)  # slow-moving noise, a few minutes long
        rate = peak_per_s * daily * WEEKDAY_FACTOR[int(day)] * math.exp(level)
        if spike is not None and spike.at_minute <= minute < spike.at_minute + spike.minutes:
            rate *= spike.factor
        rates.append(rate)
    return rates


def _business_hours(hour: float, opening_min: float) -> float:
    # Opens at 08:30 (10 % to 90 % in ``opening_min``; a logistic spans 4.4 scales from 10 % to
    # 90 %), a dip at lunch, a second peak at 15:00, and a slow evening decline.
    opening = 1.0 / (1.0 + math.exp(-(hour - 8.5) / (opening_min / 60 / 4.4)))
    closing = 1.0 / (1.0 + math.exp((hour - 18.0) / 0.6))
    lunch = 1.0 - 0.25 * math.exp(-(((hour - 12.75) / 0.6) ** 2))
    afternoon = 1.0 + 0.15 * math.exp(-(((hour - 15.0) / 1.0) ** 2))
    return min(opening * closing * lunch * afternoon, 1.0)


def history_counts(
    peak_per_s: float, weeks: int, *, seed: int, opening_min: float = 25.0
) -> list[int]:
    """Per-minute arrival counts of ``weeks`` past weeks (each with its own noise, no spike)."""
    rng = random.Random(seed)
    counts: list[int] = []
    for week in range(weeks):
        for rate in week_rates(peak_per_s, seed=seed * 1000 + week, opening_min=opening_min):
            mean = rate * 60.0
            counts.append(max(0, round(rng.gauss(mean, math.sqrt(mean)))))
    return counts


@dataclass(frozen=True, slots=True)
class LagPolicy:
    """One member per ``lag_per_member`` messages queued or running."""

    lag_per_member: float
    name: str = "lag"

    def desired(self, seen: Observation, fleet: Fleet) -> int:  # noqa: ARG002 - the protocol
        """``ceil(lag / lag_per_member)``."""
        return math.ceil((seen.queued + seen.busy) / self.lag_per_member)


@dataclass(frozen=True, slots=True)
class UtilisationPolicy:
    """Members so that the busy slots fill ``target`` of the slots."""

    target: float = 0.7
    name: str = "utilisation"

    def desired(self, seen: Observation, fleet: Fleet) -> int:
        """``ceil(busy / (slots_per_member * target))``."""
        return math.ceil(seen.busy / (fleet.slots_per_member * self.target))


@dataclass
class PredictivePolicy:
    """Utilisation plus backlog, floored by the members the forecast of the next minutes needs.

    It asks for what the lane's ScaledObject does (docs/capacity.md), computed by the same
    functions as :func:`~pipeline.capacity.plan.plan_lane`: ``max(ceil(busy / (slots x
    reactive_target)) + backlog_members(waiting), members_for(max(forecast peak, rate of the
    last five minutes)))``, where the waiting messages are the lag less the busy slots.

    Attributes:
        history: per-minute counts of the weeks before the simulated one, oldest first.
        lookahead_min: minutes ahead the forecast covers (start-up plus a scale-down window).
        target: the slot utilisation the forecast plans for (the Little's-law headroom).
        reactive_target: the utilisation the reactive part keeps; it only has to catch what
            the forecast missed, so it can run hotter than ``target``.
        recent_min: minutes of the trend window.
        drain_s: a backlog beyond one member's slots is given the members to drain it within
            this many seconds (``CAPACITY__DRAIN_S``); None: no backlog term.
    """

    history: Sequence[int]
    lookahead_min: int = 15
    target: float = 0.7
    reactive_target: float = 0.7
    recent_min: int = 15
    drain_s: float | None = 300.0
    name: str = "predictive"
    _cache: dict[int, int] = field(default_factory=dict)

    def desired(self, seen: Observation, fleet: Fleet) -> int:
        """``max(utilisation wish + backlog, forecast members)``, re-forecast once a minute."""
        slots = fleet.slots_per_member
        reactive = math.ceil(seen.busy / (slots * self.reactive_target))
        minute = int(seen.now_s // 60)
        if minute not in self._cache:
            self._cache[minute] = self._forecast_members(seen.minute_counts, minute, fleet)
        if self.drain_s is not None:  # lag less busy slots: the messages waiting for a slot
            reactive += backlog_members(seen.queued, fleet.service_s, slots, drain_s=self.drain_s)
        return max(reactive, self._cache[minute])

    def _forecast_members(self, current: Sequence[int], minute: int, fleet: Fleet) -> int:
        offset = len(self.history)
        now = offset + minute

        def count(index: int) -> int:
            return self.history[index] if index < offset else current[index - offset]

        recent = [count(i) for i in range(max(0, now - self.recent_min), now)]
        past = []
        for week in range(1, 5):
            start = now - week * MINUTES_PER_WEEK - len(recent)
            if start < 0:
                break
            past.append([count(i) for i in range(start, start + len(recent) + self.lookahead_min)])
        forecast = seasonal_forecast(recent, past, self.lookahead_min)
        rate_per_s = sum(recent[-5:]) / (5 * 60.0)  # the plan's floor: the current rate
        return members_for(
            max(forecast.peak_per_s, rate_per_s),
            fleet.service_s,
            fleet.slots_per_member,
            target_utilisation=self.target,
            floor=fleet.min_members,
        )
