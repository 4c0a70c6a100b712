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
- predictive: what the manifests' triggers ask for: busy slots at 85 % plus the members a
  backlog beyond one member's slots needs to drain within 300 s, but at least the seasonal
  forecast of the next 10 minutes from three past weeks (or the last five minutes' rate, when
  higher) sized by Little's law at 85 % utilisation.

Lag's cost depends on its threshold (a higher one runs hotter and waits longer), so the
predictive policy is compared with the lag policy of equal cost: bisecting between the printed
thresholds to where lag spends the predictive policy's slot-hours (or just above), keeping the
one that waits least when there are several, or the cheapest lag policy when every threshold
costs more. The last line is JSON: the predictive
policy's p99 wait and slot-hours as ratios of that lag policy's on the week where predictive does
worse (``headline_week``), and each week in full under ``sharp_opening`` and ``gradual_opening``.

``--seeds 3,5,7`` runs both weeks for each seed (weeks, noise, arrivals and service times all
follow the seed). The headline is then the worst week of all of them (``headline_seed``,
``headline_week``), the median over the weeks is given beside it, and every week is under
``seeds``. ``--workers`` sets how many simulations run at once (2 by default).
See docs/capacity.md.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import statistics
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


def _run(job: tuple[int, float, Policy]) -> Outcome:
    seed, opening_min, policy = job
    rates = week_rates(PEAK_PER_S, seed=seed, spike=SPIKE, opening_min=opening_min)
    return simulate(rates, policy, FLEET, seed=seed)


def compare(opening: str, pool: ProcessPoolExecutor, seed: int = SEED) -> dict[str, Any]:
    """Run every policy on one week; print a line each; the ratios against equal-cost lag."""
    opening_min = OPENINGS_MIN[opening]
    began = time.perf_counter()
    history = history_counts(PEAK_PER_S, HISTORY_WEEKS, seed=seed + 100, opening_min=opening_min)
    predictive = PredictivePolicy(
        history, lookahead_min=10, target=PREDICTIVE_TARGET, reactive_target=PREDICTIVE_TARGET
    )
    policies: list[Policy] = [
        predictive,
        UtilisationPolicy(0.7),
        *(LagPolicy(threshold, name=f"lag/{threshold:g}") for threshold in LAG_FRONTIER),
    ]
    outcomes = list(pool.map(_run, [(seed, opening_min, policy) for policy in policies]))
    pred = outcomes[0]
    lags = dict(zip(LAG_FRONTIER, outcomes[2:], strict=True))
    equal = _equal_cost(pred.slot_hours, lags, (seed, opening_min), pool)
    for outcome in [*outcomes, equal]:
        print(
            f"seed {seed:<3}{opening:<8}{outcome.policy:<12} mean wait "
            f"{outcome.mean_wait_s:6.2f} s  p99 {outcome.p99_wait_s:6.2f} s  max "
            f"{outcome.max_wait_s:6.1f} s  slot-hours "
            f"{outcome.slot_hours:8.1f}  peak members {outcome.peak_members:>3}",
            file=sys.stderr,
        )
    print(f"seed {seed} {opening}: {time.perf_counter() - began:.0f} s", file=sys.stderr)
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
    week: tuple[int, float],
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
            lag = LagPolicy(middle, name=f"lag/{middle:.2f}")
            outcome = pool.submit(_run, (*week, lag))
            result = outcome.result()
            if result.slot_hours >= slot_hours:
                costly, best = middle, result
            else:
                cheap = middle
        found.append(best)
    if not found:
        return min(lags.values(), key=lambda o: o.slot_hours)
    return min(found, key=lambda o: o.p99_wait_s)


def main(argv: list[str] | None = None) -> int:
    """Both weeks of each seed, then the JSON summary (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--seeds",
        default=str(SEED),
        help=f"comma-separated seeds of the weeks and arrivals (default {SEED})",
    )
    parser.add_argument("--workers", type=int, default=2, help="simulations run at once")
    args = parser.parse_args(argv)
    try:
        seeds = [int(part) for part in args.seeds.split(",")]
    except ValueError:
        print(f"error: --seeds must be integers separated by commas, got {args.seeds!r}")
        return 2
    with ProcessPoolExecutor(max_workers=max(1, args.workers)) as pool:
        runs = {seed: {w: compare(w, pool, seed) for w in OPENINGS_MIN} for seed in seeds}
    print(json.dumps(summarise(runs)))
    return 0


def summarise(runs: dict[int, dict[str, dict[str, Any]]]) -> dict[str, Any]:
    """The last line: the worst week's ratios as the headline, every week in full.

    The headline is the week where the predictive policy does worst against equal-cost lag:
    over both weeks of one seed, or over every week of every seed when several are run (then
    the median over those weeks is given too). A week where both wait 0 s at p99 has no ratio
    (null) and ranks as a tie (1.0); one where only lag waits 0 s ranks as the worst possible.
    """
    weeks = [
        (seed, week, result) for seed, by_week in runs.items() for week, result in by_week.items()
    ]
    seed, worse, result = max(weeks, key=lambda item: _rank(item[2]))
    summary: dict[str, Any] = {
        "bench": "scaling",
        "p99_wait_ratio_vs_lag": result["p99_wait_ratio_vs_lag"],
        "slot_hours_ratio_vs_lag": result["slot_hours_ratio_vs_lag"],
        "headline": "worst week" if len(runs) == 1 else f"worst week of seeds {sorted(runs)}",
        "headline_seed": seed,
        "headline_week": worse,
        "opening_min": OPENINGS_MIN[worse],
        "headline_p99_wait_s": {
            "predictive": result["p99_wait_s"]["predictive"],
            result["lag"]: result["p99_wait_s"][result["lag"]],
        },
    }
    if len(runs) > 1:
        median = statistics.median(_rank(item[2]) for item in weeks)
        summary["median_p99_wait_ratio_vs_lag"] = round(median, 3) if median < math.inf else None
        summary["seeds"] = {
            str(s): {f"{w}_opening": r for w, r in by_week.items()} for s, by_week in runs.items()
        }
    else:
        summary |= {f"{w}_opening": r for w, r in runs[seed].items()}
    return summary


def _rank(result: dict[str, Any]) -> float:
    ratio = result["p99_wait_ratio_vs_lag"]
    if ratio is not None:
        return float(ratio)
    return 1.0 if result["p99_wait_s"]["predictive"] == 0 else math.inf


def _ratio(value: float, reference: float) -> float | None:
    return round(value / reference, 3) if reference > 0 else None


if __name__ == "__main__":
    raise SystemExit(main())
