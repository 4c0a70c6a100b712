"""A mistyped setting is named in one line, and its secret is never echoed back."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


@pytest.mark.parametrize(
    ("variable", "value", "secret"),
    [
        ("PIPELINE_POSTGRES__URL", "postgress://app:hunter2-pw@db:5432/x", "hunter2-pw"),
        (
            "PIPELINE_REGISTRY__AUTH__USERS",
            '[{"username": "ci", "pasword": "s3cret-pw", "role": "write"}]',
            "s3cret-pw",
        ),
    ],
    ids=["postgres-url", "registry-user-misspelt-key"],
)
def test_a_bad_setting_never_echoes_its_secret(variable: str, value: str, secret: str) -> None:
    """The error names the variable; the password inside its value appears nowhere."""
    result = subprocess.run(
        [sys.executable, "-m", "pipeline", "topics", "list"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, variable: value},
        check=False,
    )
    assert result.returncode == 2
    assert variable in result.stderr
    assert secret not in result.stdout + result.stderr
    assert "Traceback" not in result.stderr


def test_a_harmless_bad_value_is_still_shown() -> None:
    """A plain mistyped choice keeps its value in the message, so the typo is visible."""
    result = subprocess.run(
        [sys.executable, "-m", "pipeline", "topics", "list"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PIPELINE_TRANSPORT": "rabbitmq"},
        check=False,
    )
    assert "(got 'rabbitmq')" in result.stderr
