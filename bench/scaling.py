"""Scaling policies on one simulated week: p99 wait and slot-hours (``make bench-scaling``).

One lane (16 slots per member, 20 s mean service, members ready 300 s after they are asked for,
HPA-style scale-down: 600 s stabilisation, one member per 120 s) receives a week-shaped arrival
curve: weekdays open sharply at 08:30 and peak at PEAK_PER_S, with a lunch dip and a 15:00
peak; nights and weekends are quiet; minute-level noise; one unannounced spike (Thursday 14:30,
1.6x for 20 minutes). The policies run on the same arrivals (same seed):

- lag: one member per ``lag_per_member`` messages queued or running (16 = one member's slots);
  the frontier of other thresholds is printed too;
- utilisation: busy slots at 70 % of the slots (the manifests' slot trigger);
- predictive: the seasonal forecast of the next 10 minutes from three past weeks, sized by
  Little's law at 85 % utilisation, beside a utilisation trigger at 85 %.

The last line is JSON: the predictive policy's p99 wait and slot-hours as ratios of lag's, and
``equal_cost``: the same ratio against the cheapest lag threshold that costs at least as many
slot-hours as the predictive policy. See docs/capacity.md.
"""

from __future__ import annotations

import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor

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
LAG_PER_MEMBER = float(FLEET.slots_per_member)
LAG_FRONTIER = (8.0, 10.0, 12.0, 14.0, LAG_PER_MEMBER, 20.0)
PREDICTIVE_TARGET = 0.85


def _run(policy: Policy) -> tuple[Outcome, float]:
    began = time.perf_counter()
    rates = week_rates(PEAK_PER_S, seed=SEED, spike=SPIKE)
    return simulate(rates, policy, FLEET, seed=SEED), time.perf_counter() - began


def main() -> int:
    """Run the policies (two at a time), print one line each, then the JSON summary."""
    history = history_counts(PEAK_PER_S, HISTORY_WEEKS, seed=SEED + 100)
    predictive = PredictivePolicy(
        history, lookahead_min=10, target=PREDICTIVE_TARGET, reactive_target=PREDICTIVE_TARGET
    )
    policies: list[Policy] = [
        predictive,
        UtilisationPolicy(0.7),
        *(LagPolicy(threshold, name=f"lag/{threshold:g}") for threshold in LAG_FRONTIER),
    ]
    with ProcessPoolExecutor(max_workers=2) as pool:
        runs = list(pool.map(_run, policies))
    results = {outcome.policy: outcome for outcome, _ in runs}
    for outcome, took_s in runs:
        print(
            f"{outcome.policy:<12} messages {outcome.messages:>9,}  mean wait "
            f"{outcome.mean_wait_s:6.2f} s  p99 {outcome.p99_wait_s:6.2f} s  max "
            f"{outcome.max_wait_s:6.1f} s  slot-hours {outcome.slot_hours:8.1f}  peak members "
            f"{outcome.peak_members:>3}  ({took_s:.1f} s)",
            file=sys.stderr,
        )
    pred = results["predictive"]
    lag = results[f"lag/{LAG_PER_MEMBER:g}"]
    costlier = [
        o
        for name, o in results.items()
        if name.startswith("lag/") and o.slot_hours >= pred.slot_hours
    ]
    equal = min(costlier, key=lambda o: o.slot_hours) if costlier else None
    summary = {
        "bench": "scaling",
        "p99_wait_ratio_vs_lag": _ratio(pred.p99_wait_s, lag.p99_wait_s),
        "slot_hours_ratio_vs_lag": _ratio(pred.slot_hours, lag.slot_hours),
        "lag_per_member": LAG_PER_MEMBER,
        "equal_cost": None
        if equal is None
        else {
            "lag": equal.policy,
            "p99_wait_ratio": _ratio(pred.p99_wait_s, equal.p99_wait_s),
            "slot_hours_ratio": _ratio(pred.slot_hours, equal.slot_hours),
        },
        "p99_wait_s": {name: round(o.p99_wait_s, 3) for name, o in results.items()},
        "slot_hours": {name: round(o.slot_hours, 1) for name, o in results.items()},
        "messages": pred.messages,
    }
    print(json.dumps(summary))
    return 0


def _ratio(value: float, reference: float) -> float | None:
    return round(value / reference, 3) if reference > 0 else None


if __name__ == "__main__":
    raise SystemExit(main())
