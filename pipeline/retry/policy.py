"""Which failures are retried, and how long a retry tier waits.

Retriability is this one function, not ``except`` clauses spread over the runtime: a handler's
``Retry`` is retried, ``DeadLetter`` never, validation errors (the payload will not get better)
never, and any other exception is retried. An :class:`~pipeline.runtime.app.App` may be given
another function.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from pydantic import ValidationError

from pipeline.errors import DeadLetter, Retry

Retryable = Callable[[BaseException], bool]


def default_retryable(error: BaseException) -> bool:
    """True if ``error`` may succeed on another attempt."""
    if isinstance(error, Retry):
        return True
    return not isinstance(error, (DeadLetter, ValidationError, UnicodeDecodeError))


@dataclass(frozen=True, slots=True)
class Backoff:
    """Delay of a retry tier with jitter: between half the tier and the whole tier.

    Jitter spreads a burst of failures so the retries do not return as one burst; the due time
    is stamped on the message, and the tier consumer never processes it before that time.
    """

    tiers_ms: tuple[int, ...]

    def compute_ms(self, tier: int, rng: random.Random | None = None) -> int:
        """The delay of tier ``tier`` (0-based) in milliseconds."""
        base = self.tiers_ms[tier]
        return int(base / 2 + (rng or random).uniform(0, base / 2))
