"""Helpers for the tests of settings' error lines: the line a bad value gives."""

from __future__ import annotations

import pytest

from pipeline.config import load_settings
from pipeline.errors import ConfigError


def config_line(monkeypatch: pytest.MonkeyPatch, variable: str, value: str) -> str:
    """The configuration error's line with ``variable`` set to ``value``, or ``(accepted)``.

    The variable is unset again before this returns.
    """
    monkeypatch.setenv(variable, value)
    try:
        load_settings()
    except ConfigError as exc:
        return str(exc)
    finally:
        monkeypatch.delenv(variable)
    return "(accepted)"
