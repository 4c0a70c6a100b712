"""A retry budget: retries may be at most a fraction of the traffic, or a storm is cut short.

Each processed message deposits ``ratio`` of a token; each retry withdraws one; a floor of
``min_per_s`` tokens per second keeps a quiet lane able to retry at all. The balance is capped
at ten seconds' worth of the floor plus what ``ratio`` earns over the same window, so a long
quiet spell cannot save up a storm. A failure that finds the budget empty is still retried,
but on the longest tier (see :class:`~pipeline.topics.spec.RetryBudgetPolicy`).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from pipeline.topics.spec import RetryBudgetPolicy

_WINDOW_S = 10.0


class RetryBudget:
    """A token bucket of retries, filled by traffic and by a per-second floor."""

    def __init__(
        self, policy: RetryBudgetPolicy, clock: Callable[[], float] = time.monotonic
    ) -> None:
        """Start with a full floor's worth of tokens."""
        self._ratio = policy.ratio
        self._min_per_s = policy.min_per_s
        self._clock = clock
        self._last_s = clock()
        self._tokens = self._cap(0)
        self._recent = 0.0
        self.exhausted = 0

    def _cap(self, recent: float) -> float:
        return max(1.0, self._min_per_s * _WINDOW_S + recent * self._ratio)

    def _refill(self) -> None:
        now_s = self._clock()
        elapsed_s = now_s - self._last_s
        self._last_s = now_s
        self._recent = max(0.0, self._recent - self._recent * elapsed_s / _WINDOW_S)
        self._tokens = min(self._cap(self._recent), self._tokens + elapsed_s * self._min_per_s)

    def processed(self) -> None:
        """Count one processed message: it earns ``ratio`` of a retry."""
        self._recent += 1
        self._tokens = min(self._cap(self._recent), self._tokens + self._ratio)

    def try_spend(self) -> bool:
        """Take one retry from the budget; False when it is spent (use the longest tier)."""
        self._refill()
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return True
        self.exhausted += 1
        return False
