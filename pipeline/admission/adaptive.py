"""Adaptive limits for downstream quotas: a throttle key that stands for a dependency.

A lane's throttle may name a key such as ``dep:vision-api`` and make it *adaptive*
(``throttle.adaptive`` in ``topics/*.yaml``). Its limit is then an AIMD window shared by the
whole fleet through Redis: every job that held the key reports, when it releases its slots (in
the same round trip), how the call went:

* ``ok``: the window grows by one slot per window of successes (additive increase);
* ``slow`` (the handler took longer than the policy's ``latency``) or ``throttled`` (the handler
  raised :class:`pipeline.errors.Throttled`, as on a 429): the window shrinks by ``decrease``, at
  most once per ``cooldown`` so one congestion event is not counted once per job in flight;
* a ``Retry-After`` (``Throttled(retry_after_s=...)``) closes the key to new jobs until then;
  the first throttle call after that time (any member's acquire, release or heartbeat) reopens it;
* any other failure says nothing about the dependency's quota: no feedback.

The window stays between ``min`` and ``max``. ``pipeline throttle set-limit`` on an adaptive key
restarts the window from the value set. See ``lua/throttle.lua`` (``adapt``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from pipeline.topics.spec import AdaptivePolicy

Outcome = Literal["ok", "slow", "throttled"]


@dataclass(frozen=True, slots=True)
class Feedback:
    """How one job's call to an adaptive key's dependency went."""

    key: str
    outcome: Outcome
    policy: AdaptivePolicy
    retry_after_ms: int = 0

    def args(self) -> list[str | int | float]:
        """The seven ``thr_release`` arguments of this feedback."""
        p = self.policy
        return [
            self.key,
            self.outcome,
            self.retry_after_ms,
            p.min,
            p.max,
            p.decrease,
            p.cooldown_ms,
        ]


def feedback_for(
    keys: Iterable[str],
    adaptive: dict[str, AdaptivePolicy],
    *,
    duration_s: float,
    throttled: bool,
    retry_after_s: float | None = None,
    dependency: str | None = None,
) -> list[Feedback]:
    """Feedback on each adaptive key among ``keys`` for one finished job.

    ``dependency`` narrows a throttled outcome to the key ``dep:<dependency>`` (or the key of
    that name); without it every adaptive key of the job is told.
    """
    out: list[Feedback] = []
    for key in keys:
        policy = adaptive.get(key)
        if policy is None:
            continue
        blamed = throttled and dependency in (None, key, key.removeprefix("dep:"))
        if blamed:
            out.append(Feedback(key, "throttled", policy, _closed_for_ms(retry_after_s)))
        elif policy.latency_ms is not None and duration_s * 1000 > policy.latency_ms:
            out.append(Feedback(key, "slow", policy))
        else:
            out.append(Feedback(key, "ok", policy))
    return out


def _closed_for_ms(retry_after_s: float | None) -> int:
    """A Retry-After in whole ms; none for one that is not a finite time (NaN, inf) or negative."""
    if retry_after_s is None or not math.isfinite(retry_after_s) or retry_after_s <= 0:
        return 0
    return round(retry_after_s * 1000)


def release_args(feedback: Sequence[Feedback]) -> list[str | int | float]:
    """The flattened feedback arguments of ``thr_release``."""
    return [value for f in feedback for value in f.args()]
