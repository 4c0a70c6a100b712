"""A measured duration printed for a reader: two units, rounded up, never shorter."""

from __future__ import annotations

import pytest

from pipeline.topics.durations import format_duration_up_ms, parse_duration_ms

DAY_MS = 86_400_000


@pytest.mark.parametrize(
    ("duration_ms", "shown"),
    [
        (3_542_403_545, "41d 1h"),  # a purge's measured floor: was "3542403545ms"
        (7 * DAY_MS, "7d"),  # exact: as format_duration_ms writes it
        (DAY_MS + 1, "1d 1h"),
        (5 * 3_600_000 + 1, "5h 1m"),
        (1_500, "1s 500ms"),
        (999, "999ms"),
        (23 * 3_600_000 + 59 * 60_000 + 1, "1d"),  # rounded up into the larger unit
    ],
)
def test_a_measured_duration_is_two_units_rounded_up(duration_ms: int, shown: str) -> None:
    """The shown duration is read back as at least the measured one."""
    assert format_duration_up_ms(duration_ms) == shown
    assert sum(parse_duration_ms(part) for part in shown.split()) >= duration_ms
