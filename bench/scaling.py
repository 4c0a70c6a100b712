"""Scaling policies on a simulated week: p99 wait and slot-hours (``make bench-scaling``).

One lane (16 slots per member, 20 s mean service, members ready 300 s after they are asked for,
HPA-style scale-down: 600 s stabilisation, one member per 120 s) receives a week-shaped arrival
curve: weekdays open at 08:30 and peak at PEAK_PER_S, with a lunch dip and a 15:00 peak; nights
and weekends are quiet; minute-level noise; one unannounced spike (Thursday 14:30, 1.6x for 20
minutes). Two weeks are simulated: the day opening sharply (10 % to 90 % of the peak in 5
minutes: office hours, scheduled sends) and gradually (in 25 minutes). On each, the policies see
the same arrivals (same seed):

- lag: one member per ``lag_per_member`` messages queued or running, for several thresholds;
- utilisation: busy slots at 70 % of the slots (the manifests' slot trigger);
- predictive: the seasonal forecast of the next 10 minutes from three past weeks, sized by
  Little's law at 85 % utilisation, beside a utilisation trigger at 85 %.

Lag's cost depends on its threshold (a higher one runs hotter and waits longer), so the
predictive policy is compared with the lag policy of equal cost: bisecting between the printed
thresholds to where lag spends the predictive policy's slot-hours (or just above), keeping the
one that waits least when there are several, or the cheapest lag policy when every threshold
costs more. The last line is JSON: the predictive
policy's p99 wait and slot-hours as ratios of that lag policy's on the week where predictive does
worse (``headline_week``), and each week in full under ``sharp_opening`` and ``gradual_opening``.
See docs/capacity.md.
"""

from __future__ import annotations

import itertools
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from pipeline.capacity.policies import (
    LagPolicy,
    PredictivePolicy,
    Spike,
    UtilisationPolicy,
    history_counts,
    week_rates,
)
from pipeline.capacity.simulation import Fleet, Outcome, Policy, simulate

PEAK_PER_S = 4.0
SEED = 3
HISTORY_WEEKS = 3
SPIKE = Spike(at_minute=3 * 1440 + 14 * 60 + 30, minutes=20, factor=1.6)
FLEET = Fleet()
LAG_FRONTIER = (10.0, 12.0, 14.0, 16.0, 20.0, 24.0, 32.0)
PREDICTIVE_TARGET = 0.85
OPENINGS_MIN = {"sharp": 5.0, "gradual": 25.0}


def _run(job: tuple[float, Policy]) -> Outcome:
    opening_min, policy = job
    rates = week_rates(PEAK_PER_S, seed=SEED, spike=SPIKE, opening_min=opening_min)
    return simulate(rates, policy, FLEET, seed=SEED)


def compare(opening: str, pool: ProcessPoolExecutor) -> dict[str, Any]:
    """Run every policy on one week; print a line each; the ratios against equal-cost lag."""
    opening_min = OPENINGS_MIN[opening]
    began = time.perf_counter()
    history = history_counts(PEAK_PER_S, HISTORY_WEEKS, seed=SEED + 100, opening_min=opening_min)
    predictive = PredictivePolicy(
        history, lookahead_min=10, target=PREDICTIVE_TARGET, reactive_target=PREDICTIVE_TARGET
    )
    policies: list[Policy] = [
        predictive,
        UtilisationPolicy(0.7),
        *(LagPolicy(threshold, name=f"lag/{threshold:g}") for threshold in LAG_FRONTIER),
    ]
    outcomes = list(pool.map(_run, [(opening_min, policy) for policy in policies]))
    pred = outcomes[0]
    lags = dict(zip(LAG_FRONTIER, outcomes[2:], strict=True))
    equal = _equal_cost(pred.slot_hours, lags, opening_min, pool)
    for outcome in [*outcomes, equal]:
        print(
            f"{opening:<8}{outcome.policy:<12} mean wait {outcome.mean_wait_s:6.2f} s  p99 "
            f"{outcome.p99_wait_s:6.2f} s  max {outcome.max_wait_s:6.1f} s  slot-hours "
            f"{outcome.slot_hours:8.1f}  peak members {outcome.peak_members:>3}",
            file=sys.stderr,
        )
    print(f"{opening}: {time.perf_counter() - began:.0f} s", file=sys.stderr)
    return {
        "p99_wait_ratio_vs_lag": _ratio(pred.p99_wait_s, equal.p99_wait_s),
        "slot_hours_ratio_vs_lag": _ratio(pred.slot_hours, equal.slot_hours),
        "lag": equal.policy,
        "p99_wait_s": {o.policy: round(o.p99_wait_s, 3) for o in [*outcomes, equal]},
        "slot_hours": {o.policy: round(o.slot_hours, 1) for o in [*outcomes, equal]},
    }


def _equal_cost(
    slot_hours: float,
    lags: dict[float, Outcome],
    opening_min: float,
    pool: ProcessPoolExecutor,
) -> Outcome:
    """The lag policy that spends ``slot_hours`` and waits least; the cheapest if none can.

    Slot-hours are not monotonic in the threshold (a hot lane overshoots after each backlog),
    so every pair of neighbouring thresholds whose costs straddle ``slot_hours`` is bisected
    to the threshold of equal cost (at or above it), and the one with the lowest p99 wins.
    """
    thresholds = sorted(lags)
    found = []
    for low, high in itertools.pairwise(thresholds):
        above_low = lags[low].slot_hours >= slot_hours
        if above_low == (lags[high].slot_hours >= slot_hours):
            continue
        costly, cheap = (low, high) if above_low else (high, low)
        best = lags[costly]
        for _ in range(5):
            middle = (costly + cheap) / 2
            outcome = pool.submit(_run, (opening_min, LagPolicy(middle, name=f"lag/{middle:.2f}")))
            result = outcome.result()
            if result.slot_hours >= slot_hours:
                costly, best = middle, result
            else:
                cheap = middle
        found.append(best)
    if not found:
        return min(lags.values(), key=lambda o: o.slot_hours)
    return min(found, key=lambda o: o.p99_wait_s)


def main() -> int:
    """Both weeks, then the JSON summary: the headline is the week where predictive does worse."""
    with ProcessPoolExecutor(max_workers=2) as pool:
        sharp = compare("sharp", pool)
        gradual = compare("gradual", pool)
    weeks = {"sharp": sharp, "gradual": gradual}
    worse = max(weeks, key=lambda w: weeks[w]["p99_wait_ratio_vs_lag"] or 0.0)
    summary = {
        "bench": "scaling",
        "p99_wait_ratio_vs_lag": weeks[worse]["p99_wait_ratio_vs_lag"],
        "slot_hours_ratio_vs_lag": weeks[worse]["slot_hours_ratio_vs_lag"],
        "headline_week": worse,
        "opening_min": OPENINGS_MIN[worse],
        "sharp_opening": sharp,
        "gradual_opening": gradual,
    }
    print(json.dumps(summary))
    return 0


def _ratio(value: float, reference: float) -> float | None:
    return round(value / reference, 3) if reference > 0 else None


if __name__ == "__main__":
    raise SystemExit(main())
