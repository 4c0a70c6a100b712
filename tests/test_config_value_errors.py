"""A setting a validator refuses reads as its own sentence, without pydantic's prefix."""

from __future__ import annotations

import pytest

from pipeline.config import load_settings
from pipeline.errors import ConfigError


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("http://localhost:6379", "expected redis://host:port/db, rediss://... or unix:///path"),
        ("redis://127.0.0.1:6379/abc", "with a database number, got '/abc'"),
        ("redis://127.0.0.1:6379/x1y2z3w4v5u6t7s8", "with a database number, got '/***'"),
    ],
)
def test_a_bad_redis_url_reads_cleanly(
    url: str, says: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PIPELINE_REDIS__URL's problem follows the variable's name directly, with no 'Value error'."""
    monkeypatch.setenv("PIPELINE_REDIS__URL", url)
    with pytest.raises(ConfigError) as caught:
        load_settings()
    message = str(caught.value)
    assert message.startswith("invalid configuration: PIPELINE_REDIS__URL: expected "), message
    assert says in message
    assert "Value error" not in message
