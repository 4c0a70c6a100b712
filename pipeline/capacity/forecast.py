"""A seasonal forecast of a lane's arrivals: the same minutes of past weeks (or days), scaled.

Given per-minute arrival counts, the forecast for the next ``horizon`` minutes is

1. the **baseline**: the mean, minute by minute, of the same window in each past season
   (the same minutes of the week in past weeks when there is at least one week of history,
   else the same minutes of the day in past days);
2. times the **trend**: how the last ``recent`` minutes compare with the baseline of those same
   minutes, ``(actual + 1) / (baseline + 1)`` clamped to ``[TREND_MIN, TREND_MAX]``, so a lane
   growing 20 % week over week is forecast 20 % higher and a noisy minute does not swing it.

With no seasonal history at all the forecast is the recent mean rate, flat. No dependency beyond
the standard library; the windows come from :class:`~pipeline.capacity.history.ArrivalHistory`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["TREND_MAX", "TREND_MIN", "Forecast", "seasonal_forecast"]

TREND_MIN = 0.5
TREND_MAX = 3.0


@dataclass(frozen=True, slots=True)
class Forecast:
    """Forecast arrivals per minute for the next minutes.

    Attributes:
        per_minute: expected arrivals in each of the next minutes.
        trend: the factor applied to the seasonal baseline (1.0: none).
        seasons: how many past windows the baseline averaged (0: recent rate only).
    """

    per_minute: tuple[float, ...]
    trend: float
    seasons: int

    @property
    def peak_per_s(self) -> float:
        """The busiest forecast minute, in arrivals per second (what capacity must meet)."""
        return max(self.per_minute, default=0.0) / 60.0

    @property
    def mean_per_s(self) -> float:
        """The mean forecast rate over the horizon, in arrivals per second."""
        if not self.per_minute:
            return 0.0
        return sum(self.per_minute) / len(self.per_minute) / 60.0


def seasonal_forecast(
    recent: Sequence[float], past: Sequence[Sequence[float]], horizon: int
) -> Forecast:
    """Forecast ``horizon`` minutes from the ``recent`` minutes and past seasons' windows.

    Args:
        recent: arrivals in each of the last minutes, oldest first (its length is the trend
            window, ``R``).
        past: one window per past season (a week or a day earlier, ...), each ``R + horizon``
            minutes long and aligned with ``recent`` followed by the forecast minutes; seasons
            with no recorded data are left out by the caller.
        horizon: minutes to forecast.
    """
    window = len(recent)
    seasons = [list(season) for season in past if len(season) >= window + horizon]
    if not seasons:
        flat = sum(recent) / window if window else 0.0
        return Forecast((flat,) * horizon, 1.0, 0)
    span = window + horizon
    baseline = [sum(season[i] for season in seasons) / len(seasons) for i in range(span)]
    expected_recent = sum(baseline[:window])
    trend = (sum(recent) + 1.0) / (expected_recent + 1.0) if window else 1.0
    trend = min(max(trend, TREND_MIN), TREND_MAX)
    return Forecast(tuple(value * trend for value in baseline[window:]), trend, len(seasons))
