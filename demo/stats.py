"""Folds handler observations into what the dashboard and the summary show.

Wait is the time from acceptance at the ingress to the handler call (queueing, throttling and,
on a debounced lane, the intentional quiet period). Tenant waits are kept for the lanes that are
not debounced, so the debouncer's deliberate delay does not read as unfairness; the debounced
lane is reported as turns (calls), messages per turn and turn wait.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from demo.observe import Observation
from demo.traffic import FLOODER

DEBOUNCED_LANE = "ai_turns"
SMALL = "small tenants"
"""The aggregate of every tenant but the flooder."""
_MAX_SAMPLES = 50_000


def percentile(values: Sequence[int], q: float) -> int | None:
    """The nearest-rank ``q`` quantile (0 < q <= 1) of ``values``; None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


@dataclass
class Waits:
    """Waits of one tenant or group, bounded to the most recent samples."""

    samples: list[int] = field(default_factory=list)
    count: int = 0

    def add(self, wait_ms: int) -> None:
        """Keep one more wait."""
        self.count += 1
        self.samples.append(wait_ms)
        if len(self.samples) > _MAX_SAMPLES:
            del self.samples[: _MAX_SAMPLES // 10]

    def p(self, q: float) -> int | None:
        """The ``q`` quantile of the kept samples."""
        return percentile(self.samples, q)


@dataclass
class Collector:
    """Everything observed since ``start_ms`` (observations of earlier events are ignored).

    Attributes:
        start_ms: the run's start; events received before it belong to another run.
        bucket_ms: width of the time series buckets (for the plots).
    """

    start_ms: int
    bucket_ms: int = 1_000
    tenants: dict[str, Waits] = field(default_factory=lambda: defaultdict(Waits))
    small: Waits = field(default_factory=Waits)
    turn_waits: Waits = field(default_factory=Waits)
    outcomes: Counter[str] = field(default_factory=Counter)
    handled_messages: int = 0
    turns: int = 0
    turn_messages: int = 0
    retrying_turns: dict[str, int] = field(default_factory=dict)
    finished_events: set[str] = field(default_factory=set)
    handled_per_bucket: Counter[int] = field(default_factory=Counter)
    wait_buckets: dict[tuple[str, int], list[int]] = field(
        default_factory=lambda: defaultdict(list)
    )

    def add_all(self, observations: Iterable[Observation]) -> None:
        """Fold in a batch of observations."""
        for observation in observations:
            self.add(observation)

    def add(self, o: Observation) -> None:
        """Fold in one observation."""
        if o.received_ms < self.start_ms:
            return
        self.outcomes[o.outcome] += 1
        if o.outcome != "retry" and o.event_id:
            self.finished_events.add(o.event_id)
        bucket = (o.started_ms - self.start_ms) // self.bucket_ms
        if o.outcome == "ok":
            self.handled_messages += o.size
            self.handled_per_bucket[(o.finished_ms - self.start_ms) // self.bucket_ms] += o.size
        if o.lane == DEBOUNCED_LANE:
            if o.outcome == "ok":
                self.turns += 1
                self.turn_messages += o.size
            if o.outcome == "retry":  # the debouncer runs the turn again after a backoff
                self.retrying_turns[o.key] = o.size
            else:
                self.retrying_turns.pop(o.key, None)
            if o.attempt == 1:
                self.turn_waits.add(o.wait_ms)
            return
        if o.attempt != 1:  # a retry's wait includes its tier's delay: not a queueing wait
            return
        self.tenants[o.tenant].add(o.wait_ms)
        group = "flooder" if o.tenant == FLOODER else SMALL
        if group == SMALL:
            self.small.add(o.wait_ms)
        self.wait_buckets[(group, bucket)].append(o.wait_ms)

    @property
    def turn_messages_in_retry(self) -> int:
        """Messages of debounced turns whose last call asked for a retry (held by the debouncer)."""
        return sum(self.retrying_turns.values())

    @property
    def messages_per_turn(self) -> float | None:
        """Average messages handled per debounced turn."""
        return self.turn_messages / self.turns if self.turns else None

    def flooder(self) -> Waits:
        """The flooder's waits."""
        return self.tenants[FLOODER] if FLOODER in self.tenants else Waits()

    def top_tenants(self, n: int = 5) -> list[tuple[str, Waits]]:
        """The ``n`` busiest tenants besides the flooder, by events observed."""
        ranked = sorted(
            ((name, waits) for name, waits in self.tenants.items() if name != FLOODER),
            key=lambda item: (-item[1].count, item[0]),
        )
        return ranked[:n]

    def wait_series(self, group: str, q: float) -> tuple[list[float], list[int]]:
        """(seconds since start, ``q`` quantile of waits) per bucket of ``group``."""
        points = sorted(
            (bucket, percentile(values, q) or 0)
            for (name, bucket), values in self.wait_buckets.items()
            if name == group
        )
        return [b * self.bucket_ms / 1000 for b, _ in points], [v for _, v in points]

    def throughput_series(self) -> tuple[list[float], list[float]]:
        """(seconds since start, messages handled per second) per bucket."""
        points = sorted(self.handled_per_bucket.items())
        per_s = 1000 / self.bucket_ms
        return [b * self.bucket_ms / 1000 for b, _ in points], [n * per_s for _, n in points]
