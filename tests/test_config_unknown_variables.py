"""PIPELINE_* variables that are no setting: one line naming the variable and the name meant."""

from __future__ import annotations

import logging

import pytest

from pipeline.config import load_settings
from pipeline.errors import ConfigError


@pytest.mark.parametrize(
    ("variable", "meant"),
    [
        ("PIPELINE_REDIS__URI", "PIPELINE_REDIS__URL"),
        ("PIPELINE_KAFKA__BOOTSTRAP_SERVER", "PIPELINE_KAFKA__BOOTSTRAP_SERVERS"),
        ("PIPELINE_RUNTIME__PRESSURE__ENABLE", "PIPELINE_RUNTIME__PRESSURE__ENABLED"),
    ],
)
def test_a_misspelt_variable_in_a_section_is_one_error_with_the_name_meant(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, variable: str, meant: str
) -> None:
    """A misspelt variable in a section is one error naming the setting meant, not "ignored"."""
    monkeypatch.setenv(variable, "127.0.0.1:9092")
    with caplog.at_level(logging.WARNING), pytest.raises(ConfigError) as caught:
        load_settings()
    message = str(caught.value)
    assert message == f"invalid configuration: {variable}: not a setting; did you mean {meant}?"
    assert not [r for r in caplog.records if variable in r.getMessage()]


def test_a_misspelt_section_is_still_a_warning_that_it_is_ignored(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A variable outside every section is ignored with one warning naming the setting meant."""
    monkeypatch.setenv("PIPELINE_RUNTME__SHUTDOWN_GRACE_S", "5")
    with caplog.at_level(logging.WARNING):
        settings = load_settings()
    assert settings.runtime.shutdown_grace_s == 10.0
    (line,) = [r.getMessage() for r in caplog.records if "RUNTME" in r.getMessage()]
    assert line == (
        "PIPELINE_RUNTME__SHUTDOWN_GRACE_S is not a setting and is ignored;"
        " did you mean PIPELINE_RUNTIME__SHUTDOWN_GRACE_S?"
    )
