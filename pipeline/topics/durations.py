"""Durations as topic declarations write them: ``500ms``, ``30s``, ``5m``, ``2h``, ``7d``.

:func:`parse_duration_ms` reads one (or an int of milliseconds), :func:`format_duration_ms` writes
the canonical label that retry topic names are made of, and :data:`Duration` is the pydantic type
that validates a field with them; :data:`RedisDuration` also keeps it within
:data:`MAX_REDIS_DURATION_MS`, for the fields Redis expiries are made from.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import BeforeValidator

__all__ = [
    "DURATION_HINT",
    "MAX_REDIS_DURATION_MS",
    "Duration",
    "RedisDuration",
    "format_duration_ms",
    "format_duration_up_ms",
    "parse_duration_ms",
]

DURATION_HINT = "expected a duration like 500ms, 30s, 5m, 2h, 7d"

# Largest unit first, so format_duration_ms picks the coarsest exact label.
_UNITS_MS = {"d": 86_400_000, "h": 3_600_000, "m": 60_000, "s": 1_000, "ms": 1}
_DURATION = re.compile(r"(\d+)(ms|s|m|h|d)")

MAX_REDIS_DURATION_MS = 365 * 86_400_000
"""Longest retry tier, throttle lease or cooldown, debounce window: 365 days.

Redis expiries are made from them (the run guard keeps its state for the longest tier times
twice one more than the attempts, plus an hour) and Redis refuses one past a signed 64-bit
count of milliseconds: a longer value made those calls fail, and the state they guard fail
open with no expiry.
"""


def parse_duration_ms(value: str | int) -> int:
    """Parse a duration such as ``"500ms"``, ``"30s"``, ``"5m"``, ``"2h"``, ``"7d"`` or ``1500``.

    Args:
        value: a whole number with one unit (``ms``, ``s``, ``m``, ``h``, ``d``), or an int of
            milliseconds.

    Returns:
        The duration in milliseconds, always greater than zero.

    Raises:
        ValueError: the value has another form, or is zero or negative.
    """
    # YAML can hand over anything, and bool is an int subclass: `retention: yes` is a mistake,
    # not one millisecond. ValueError, not TypeError, because pydantic reports only ValueError.
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError(f"{DURATION_HINT} (got {value!r})")  # noqa: TRY004
    if isinstance(value, int):
        duration_ms = value
    else:
        match = _DURATION.fullmatch(value.strip())
        if match is None:
            raise ValueError(f"{DURATION_HINT} (got {value!r})")
        duration_ms = int(match[1]) * _UNITS_MS[match[2]]
    if duration_ms <= 0:
        raise ValueError(f"a duration must be longer than zero (got {value!r})")
    return duration_ms


def format_duration_ms(duration_ms: int) -> str:
    """Write a duration with the coarsest unit that divides it exactly (``60000`` -> ``"1m"``).

    The label is canonical: ``"60s"``, ``"1m"`` and ``60000`` all give ``"1m"``, which is what
    makes retry topic names stable however the tier was written.
    """
    for unit, unit_ms in _UNITS_MS.items():
        if duration_ms % unit_ms == 0 and duration_ms >= unit_ms:
            return f"{duration_ms // unit_ms}{unit}"
    return f"{duration_ms}ms"


def format_duration_up_ms(duration_ms: int) -> str:
    """A measured duration for a reader: its two largest units, rounded up (``"41d 1h"``).

    :func:`format_duration_ms` writes a measured ``3542403545`` as ``3542403545ms``; here it is
    ``41d 1h``. Rounded up, so a bound printed from it (what a purge must keep) is never shorter
    than the one measured. An exact duration (``"7d"``) is written as that function writes it.
    """
    exact = format_duration_ms(duration_ms)
    units = list(_UNITS_MS.items())
    for index, (unit, unit_ms) in enumerate(units[:-1]):
        if duration_ms < unit_ms or not exact.endswith("ms"):
            continue
        small, small_ms = units[index + 1]
        rounded = -(-duration_ms // small_ms) * small_ms  # whole smaller units, rounded up
        whole, rest = divmod(rounded, unit_ms)
        return f"{whole}{unit} {rest // small_ms}{small}" if rest else format_duration_ms(rounded)
    return exact


def parse_redis_duration_ms(value: str | int) -> int:
    """:func:`parse_duration_ms`, refusing a duration past :data:`MAX_REDIS_DURATION_MS`.

    Raises:
        ValueError: as :func:`parse_duration_ms`, or the duration is longer than 365 days.
    """
    duration_ms = parse_duration_ms(value)
    if duration_ms > MAX_REDIS_DURATION_MS:
        longest = format_duration_ms(MAX_REDIS_DURATION_MS)
        raise ValueError(
            f"must be at most {longest}: Redis expiries are made from it (got {value!r})"
        )
    return duration_ms


Duration = Annotated[int, BeforeValidator(parse_duration_ms)]
RedisDuration = Annotated[int, BeforeValidator(parse_redis_duration_ms)]
