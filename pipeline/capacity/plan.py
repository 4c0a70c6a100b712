"""A lane's capacity plan: arrivals now and forecast, service time, slots, wait, members.

:func:`plan_lane` reads the lane's history (one pipelined read of the recent minutes and of the
same minutes in each past week, or day while there is less than a week), forecasts the next
``lead_s`` seconds with :func:`~pipeline.capacity.forecast.seasonal_forecast`, and sizes the lane
by Little's law (:func:`~pipeline.capacity.queueing.members_for`) for the busiest forecast
minute. The service time is the measured mean of the last hour when the members reported one,
else the lane's ``CAPACITY__SERVICE_S`` entry, else ``CAPACITY__DEFAULT_SERVICE_S``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from pipeline.capacity.forecast import Forecast, seasonal_forecast
from pipeline.capacity.history import MINUTES_PER_DAY, ArrivalHistory
from pipeline.capacity.queueing import busy_slots, mean_wait_s, members_for, slots_for_wait
from pipeline.capacity.settings import CapacitySettings

__all__ = ["MAX_SEASONS", "LanePlan", "plan_lane"]

MAX_SEASONS = 4
"""Past weeks (or days) averaged into the baseline."""
_WEEK_MIN = 7 * MINUTES_PER_DAY

ServiceSource = Literal["measured", "configured", "default"]


@dataclass(frozen=True, slots=True)
class LanePlan:
    """What one lane needs, now and over the forecast horizon.

    Attributes:
        lane: the lane.
        rate_per_s: arrivals per second over the last five whole minutes.
        forecast: the forecast of the next minutes.
        season: ``week`` or ``day`` (what the baseline averaged), or ``none``.
        service_s: mean service time in seconds, and where it came from.
        service_source: measured, configured or default.
        slots_per_member: handler slots of one member.
        members: members the plan is evaluated for (the current count when known).
        desired_members: members for the forecast peak at the target utilisation.
        target_wait_members: members whose M/M/c mean wait at the forecast peak is at most the
            target wait.
        target_utilisation: the headroom planned for.
        target_wait_s: the wait sized for.
    """

    lane: str
    rate_per_s: float
    forecast: Forecast
    season: str
    service_s: float
    service_source: ServiceSource
    slots_per_member: int
    members: int
    desired_members: int
    target_wait_members: int
    target_utilisation: float
    target_wait_s: float

    @property
    def planned_per_s(self) -> float:
        """The rate the lane is sized for: the forecast peak, or the current rate if higher."""
        return max(self.forecast.peak_per_s, self.rate_per_s)

    @property
    def slots(self) -> int:
        """Slots of :attr:`members` members."""
        return self.members * self.slots_per_member

    @property
    def utilisation(self) -> float:
        """Busy share of the slots at the current rate (Little's law; may exceed 1).

        0.0 when nothing arrives (even with no slots), ``inf`` for arrivals on no slots.
        """
        busy = busy_slots(self.rate_per_s, self.service_s)
        if busy <= 0:
            return 0.0
        return busy / self.slots if self.slots else math.inf

    @property
    def expected_wait_s(self) -> float:
        """M/M/c mean wait for a slot at the current rate with :attr:`slots` slots."""
        return mean_wait_s(self.rate_per_s, self.service_s, self.slots)


def _by_day(start: int, end: int) -> list[tuple[int, int]]:
    """The epoch-minute span ``[start, end)`` cut at UTC midnights, one span per day."""
    spans = []
    while start < end:
        day_end = min(end, (start // MINUTES_PER_DAY + 1) * MINUTES_PER_DAY)
        spans.append((start, day_end))
        start = day_end
    return spans


async def plan_lane(
    history: ArrivalHistory,
    lane: str,
    settings: CapacitySettings,
    *,
    slots_per_member: int,
    now_s: float,
    members: int | None = None,
) -> LanePlan:
    """Plan ``lane`` at Unix time ``now_s`` (``members``: the current count, if known)."""
    now = int(now_s // 60)  # the current, partial minute is left out
    recent_min = settings.trend_min
    horizon = max(1, math.ceil(settings.lead_s / 60))
    # The recent minutes are read a day at a time: a day with no key had no arrivals recorded
    # (a quiet day writes none), so it counts as zeros, not as hiding today's minutes.
    recent_spans = _by_day(now - recent_min, now)
    spans = list(recent_spans)
    for period in (_WEEK_MIN, MINUTES_PER_DAY):
        spans += [
            (now - s * period - recent_min, now - s * period + horizon)
            for s in range(1, MAX_SEASONS + 1)
        ]
    windows = await history.windows(lane, spans)
    recent = [
        count
        for (start, end), window in zip(recent_spans, windows, strict=False)
        for count in (window if window is not None else [0] * (end - start))
    ]
    seasonal = windows[len(recent_spans) :]
    weekly = [w for w in seasonal[:MAX_SEASONS] if w is not None]
    daily = [w for w in seasonal[MAX_SEASONS:] if w is not None]
    season, past = ("week", weekly) if weekly else ("day", daily) if daily else ("none", [])
    forecast = seasonal_forecast([float(c) for c in recent], past, horizon)
    rate_per_s = sum(recent[-5:]) / (5 * 60.0)
    sample = await history.service(lane, now)
    service_s: float
    source: ServiceSource
    if sample.mean_s is not None:
        service_s, source = sample.mean_s, "measured"
    elif lane in settings.service_s:
        service_s, source = settings.service_s[lane], "configured"
    else:
        service_s, source = settings.default_service_s, "default"
    peak = max(forecast.peak_per_s, rate_per_s)
    desired = members_for(
        peak,
        service_s,
        slots_per_member,
        target_utilisation=settings.target_utilisation,
        floor=settings.min_members,
    )
    waiting = 0  # nothing arrives: no member waits for a slot
    if busy_slots(peak, service_s) > 0:
        waiting = math.ceil(
            slots_for_wait(peak, service_s, settings.target_wait_s) / slots_per_member
        )
    return LanePlan(
        lane=lane,
        rate_per_s=rate_per_s,
        forecast=forecast,
        season=season if forecast.seasons else "none",
        service_s=service_s,
        service_source=source,
        slots_per_member=slots_per_member,
        members=members if members is not None else desired,
        desired_members=desired,
        target_wait_members=max(settings.min_members, waiting),
        target_utilisation=settings.target_utilisation,
        target_wait_s=settings.target_wait_s,
    )
