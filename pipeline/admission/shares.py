"""An org's own part of its dynamic limit, which admission scales by the fleet's factor now.

A dynamic limit is ``max(floor, floor(ceiling * factor)) + dedicated``
(:mod:`pipeline.admission.limits`): the ceiling, the floor and the dedicated capacity are the
org's own (its recent traffic and its settings), the factor is the fleet's (its pressure). A
fleet tick sets at most ``ORGS_A_TICK`` orgs, so above that an org keeps the limit its last
tick computed until the tick reaches it again, up to ``f_max / f_min`` times its share once the
fleet's pressure changed. So the tick stores each org's :class:`Share` beside its limit
(``T:shares``) and the fleet's factor once (``T:factor``, :func:`~pipeline.admission.keys.
fleet_factor`), and ``thr_acquire`` computes the limit from both at every admission, with the
same arithmetic as :meth:`Share.limit` (both IEEE doubles: the same limit either side). Without
the factor key (no fleet ticking, or a fleet of an earlier release) the stored limit applies.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

MAX_LIMIT = 2**31 - 1
"""The largest limit or reserve ``set_limit``/``set_reserve`` take; Lua numbers are doubles, and a
larger one would come back from Redis in exponent notation (``1e+23``), not as an integer."""

_FORM = re.compile(r"(\d+) (\d+) (\d+)")


@dataclass(frozen=True, slots=True)
class Share:
    """The org's own part of its dynamic limit."""

    ceiling: int
    """Its earned base plus burst room: what the fleet's factor scales."""
    floor: int
    """Concurrency it keeps however squeezed the fleet."""
    dedicated: int
    """Capacity reserved for it, added on top."""

    def limit(self, factor: float) -> int:
        """``max(floor, floor(ceiling * factor)) + dedicated``, not capped."""
        return max(self.floor, math.floor(self.ceiling * factor)) + self.dedicated

    def encoded(self) -> str:
        """``"CEILING FLOOR DEDICATED"``, as ``T:shares`` holds it."""
        return f"{self.ceiling} {self.floor} {self.dedicated}"

    @classmethod
    def decoded(cls, value: Any) -> Share | None:
        """The share ``T:shares`` holds as ``value``; None when absent or not of that form."""
        if value is None:
            return None
        text = value.decode(errors="replace") if isinstance(value, bytes) else str(value)
        match = _FORM.fullmatch(text)
        if match is None:
            return None
        ceiling, floor, dedicated = (int(part) for part in match.groups())
        return cls(ceiling, floor, dedicated)


def factor_text(factor: float) -> str:
    """``factor`` as ``T:factor`` holds it: the shortest text Lua reads back as the same double."""
    return repr(float(factor))


def applied(limit: Any, share: Any, factor: Any, default_limit: int) -> int:
    """A key's limit as ``thr_acquire`` computes it, from what Redis holds for it.

    ``limit``, ``share`` and ``factor`` are its ``T:limits`` and ``T:shares`` entries and the
    ``T:factor`` value (each None when absent). A share counts only beside a limit: without one
    (a member of an earlier release cleared it) the key has the default.
    """
    if limit is None:
        return default_limit
    parsed = Share.decoded(share)
    if parsed is not None and factor is not None:
        with_factor = _number(factor)
        if with_factor is not None:
            return min(MAX_LIMIT, parsed.limit(with_factor))
    return int(limit)


def _number(value: Any) -> float | None:
    try:
        number = float(value)
    except ValueError:
        return None
    return number if math.isfinite(number) else None
