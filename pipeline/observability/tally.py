"""Per-message counts kept as plain numbers and turned into metric families only when scraped.

A member finishes tens of thousands of messages a second; prometheus-client's counter and
histogram take a lock and walk their buckets on every call, which cost about a tenth of a
member's CPU per message. :class:`OutcomeTally` keeps, per label set, a count, a sum and one
non-cumulative count per bucket in ordinary Python numbers, written by the event loop alone, and
is registered as a collector: a scrape (or ``registry.get_sample_value``) builds the counter and
histogram families from them. A scrape shows what the two instruments would show, without
their ``_created`` samples.

Writes come from one thread (the event loop); a scrape from another thread copies each list once,
so a histogram's ``_count`` always equals its ``+Inf`` bucket. Its ``_sum`` may lag a write
behind, as prometheus-client's own may.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, cast

from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

if TYPE_CHECKING:
    from pipeline.observability.metrics import Family

_le = cast("Callable[[float], str]", floatToGoString)
"""A bucket bound as prometheus-client writes its ``le`` label (``0.005``, ``1.0``, ``+Inf``)."""

__all__ = ["OutcomeTally"]


class _Entry:
    __slots__ = ("buckets", "total")

    def __init__(self, size: int) -> None:
        self.buckets = [0] * size  # one more than the bounds: the last is +Inf
        self.total = 0.0


class OutcomeTally(Collector):
    """A counter family and a histogram family with the same labels, written together."""

    def __init__(self, counter: Family, histogram: Family) -> None:
        """Serve ``counter`` (how many) and ``histogram`` (how long) under the same labels."""
        if counter.kind != "counter" or histogram.kind != "histogram":
            raise TypeError(f"{counter.name} must be a counter and {histogram.name} a histogram")
        if counter.labels != histogram.labels:
            raise ValueError(f"{counter.name} and {histogram.name} must have the same labels")
        self._counter = counter
        self._histogram = histogram
        self._bounds = tuple(float(b) for b in histogram.buckets)
        self._entries: dict[tuple[str, ...], _Entry] = {}

    def add(self, labels: tuple[str, ...], value: float) -> None:
        """Count one observation of ``value`` under ``labels`` (values in label order)."""
        entry = self._entries.get(labels)
        if entry is None:
            entry = self._entries[labels] = _Entry(len(self._bounds) + 1)
        # bisect_left: a value equal to a bound falls in that bound's bucket (``le``).
        entry.buckets[bisect_left(self._bounds, value)] += 1
        entry.total += value

    def collect(self) -> Iterator[Metric]:
        """The two families as they stand now."""
        names = list(self._counter.labels)
        counter = CounterMetricFamily(
            self._counter.name.removesuffix("_total"), self._counter.help, labels=names
        )
        histogram = HistogramMetricFamily(self._histogram.name, self._histogram.help, labels=names)
        for labels, entry in list(self._entries.items()):
            counts = list(entry.buckets)
            cumulative, running = [], 0
            for bound, count in zip((*self._bounds, float("inf")), counts, strict=True):
                running += count
                cumulative.append((_le(bound), float(running)))
            counter.add_metric(list(labels), float(running))
            histogram.add_metric(list(labels), cumulative, entry.total)
        yield counter
        yield histogram
