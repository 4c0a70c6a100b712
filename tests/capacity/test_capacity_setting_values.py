"""Capacity settings that no plan can use stop the program at start, naming the variable."""

from __future__ import annotations

import pytest

from pipeline.config import load_settings
from pipeline.errors import ConfigError


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("PIPELINE_CAPACITY__SERVICE_S", '{"messages": NaN}'),
        ("PIPELINE_CAPACITY__SERVICE_S", '{"messages": Infinity}'),
        ("PIPELINE_CAPACITY__SERVICE_S", '{"messages": -5}'),
        ("PIPELINE_CAPACITY__SERVICE_S", '{"messages": 0}'),
        ("PIPELINE_CAPACITY__DEFAULT_SERVICE_S", "inf"),
        ("PIPELINE_CAPACITY__LEAD_S", "inf"),
        ("PIPELINE_CAPACITY__FLUSH_INTERVAL_S", "inf"),
        ("PIPELINE_CAPACITY__TARGET_WAIT_S", "inf"),
    ],
)
def test_a_service_time_or_interval_that_is_no_positive_finite_number_is_refused(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str
) -> None:
    """Such a value made `pipeline capacity` and the ingress plan raise, or size lanes for 0 s."""
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigError, match=variable):
        load_settings()
