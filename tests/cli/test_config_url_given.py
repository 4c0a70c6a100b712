"""A bad URL setting shows the value given (as docs/configuration.md says), never a password."""

from __future__ import annotations

import pytest

from pipeline.config import load_settings
from pipeline.errors import ConfigError


def _line(monkeypatch: pytest.MonkeyPatch, variable: str, value: str) -> str:
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigError) as caught:
        load_settings()
    return str(caught.value)


def test_a_redis_url_without_its_scheme_is_echoed_with_the_url_to_write(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """PIPELINE_REDIS__URL=localhost:6379: the value given, and the URL that means it."""
    line = _line(monkeypatch, "PIPELINE_REDIS__URL", "localhost:6379")
    assert line == (
        "invalid configuration: PIPELINE_REDIS__URL: expected redis://host:port/db, rediss://..."
        " or unix:///path; for a plain connection write redis://localhost:6379/0"
        " (got 'localhost:6379')"
    )


@pytest.mark.parametrize(
    ("variable", "value", "shown", "secret"),
    [
        ("PIPELINE_REDIS__URL", "user:pw-77x@localhost:6379", "***@localhost:6379", "pw-77x"),
        ("PIPELINE_REDIS__URL", "redis://:pw-88/y@h:6379/0", "redis://***@h:6379/0", "pw-88"),
        (
            "PIPELINE_REDIS__URL",
            "rediss://h:6379/0?pasword=pw-99z&x=1",
            "rediss://h:6379/0?pasword=***&***=***",
            "pw-99z",
        ),
        (
            "PIPELINE_POSTGRES__URL",
            "postgress://app:pw-66q@db:5432/x",
            "postgress://***@db:5432/x",
            "pw-66q",
        ),
    ],
    ids=["no-scheme-userinfo", "slash-in-password", "misspelt-password-option", "postgres"],
)
def test_a_bad_url_is_echoed_without_its_password(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str, shown: str, secret: str
) -> None:
    """The value given, its password (or a misspelt password option's value) hidden."""
    line = _line(monkeypatch, variable, value)
    assert line.endswith(f" (got {shown!r})"), line
    assert secret not in line
    assert "pw-" not in line
