"""The seasonal forecast on synthetic history."""

from __future__ import annotations

import math
import random

import pytest

from pipeline.capacity.forecast import TREND_MAX, seasonal_forecast

DAY = 1440


def daily_shape(minute: int) -> float:
    """Arrivals per minute of a clean day: 60 at night, 600 at 14:00."""
    hour = (minute % DAY) / 60
    return 60 + 540 * math.exp(-(((hour - 14) / 3) ** 2))


def windows(
    history: list[float], now: int, recent: int, horizon: int, period: int
) -> list[list[float]]:
    """The same window in each past period, as the planner reads them."""
    return [
        history[now - s * period - recent : now - s * period + horizon]
        for s in range(1, 5)
        if now - s * period - recent >= 0
    ]


@pytest.mark.parametrize("hour", [6, 9, 12, 14, 17, 22])
def test_a_clean_daily_shape_is_predicted_within_ten_percent(hour: int) -> None:
    """Three weeks of a clean daily curve (2 % jitter) forecast each next minute within 10 %."""
    rng = random.Random(hour)
    now = 21 * DAY + hour * 60
    history = [daily_shape(m) * rng.uniform(0.98, 1.02) for m in range(now)]
    forecast = seasonal_forecast(history[now - 15 : now], windows(history, now, 15, 15, DAY), 15)
    truth = [daily_shape(m) for m in range(now, now + 15)]
    assert forecast.seasons == 4
    for predicted, expected in zip(forecast.per_minute, truth, strict=True):
        assert predicted == pytest.approx(expected, rel=0.10)


@pytest.mark.parametrize("hour", [3, 9, 14, 20])
def test_a_poisson_daily_shape_is_predicted_within_ten_percent_over_the_window(hour: int) -> None:
    """With Poisson-sized noise per minute, the next 15 minutes' total is within 10 %."""
    rng = random.Random(hour)
    now = 21 * DAY + hour * 60
    history = [rng.gauss(daily_shape(m), math.sqrt(daily_shape(m))) for m in range(now)]
    forecast = seasonal_forecast(history[now - 15 : now], windows(history, now, 15, 15, DAY), 15)
    truth = sum(daily_shape(m) for m in range(now, now + 15))
    assert sum(forecast.per_minute) == pytest.approx(truth, rel=0.10)


def test_the_trend_scales_the_baseline_by_recent_growth() -> None:
    """A lane running 30 % above its usual level is forecast 30 % above its baseline."""
    past = [[100.0] * 20 for _ in range(3)]
    forecast = seasonal_forecast([130.0] * 10, past, 10)
    assert forecast.trend == pytest.approx(1.3, rel=0.01)
    assert forecast.peak_per_s == pytest.approx(130 / 60, rel=0.01)


def test_the_trend_is_clamped() -> None:
    """A burst far above the baseline raises the forecast at most TREND_MAX times."""
    forecast = seasonal_forecast([10_000.0] * 10, [[10.0] * 20], 10)
    assert forecast.trend == TREND_MAX


def test_without_seasons_the_forecast_is_the_recent_rate() -> None:
    """A lane with no past week or day is forecast flat at its recent mean."""
    forecast = seasonal_forecast([60.0, 120.0], [], 5)
    assert forecast.seasons == 0
    assert forecast.per_minute == (90.0,) * 5
    assert forecast.mean_per_s == pytest.approx(1.5)
