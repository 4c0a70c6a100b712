"""`pipeline consume` with bad Kafka client settings: one line naming the variable, no traceback."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.usefixtures("kafka_service")
PIPELINE = [sys.executable, "-m", "pipeline", "consume", "consumers.messages:app"]


def consume(client: str, unique: str) -> subprocess.CompletedProcess[str]:
    """Run one Kafka member of the example app with PIPELINE_KAFKA__CLIENT set to ``client``."""
    return subprocess.run(
        [*PIPELINE, "--group", f"g-{unique}", "--instance", f"cli-{unique}", "-t", "kafka"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PIPELINE_KAFKA__CLIENT": client},
        check=False,
    )


@pytest.mark.parametrize(
    ("client", "expected"),
    [
        ("{fetch.wait.max.ms: 50", "PIPELINE_KAFKA__CLIENT: not valid JSON"),
        (
            '{"no.such.property": "1"}',
            'PIPELINE_KAFKA__CLIENT: No such configuration property: "no.such.property"',
        ),
        (
            '{"group.protocol": "consumer", "session.timeout.ms": "6000"}',
            "PIPELINE_KAFKA__CLIENT: `session.timeout.ms` is not supported",
        ),
    ],
)
def test_bad_client_settings_stop_consume_with_one_line(
    client: str, expected: str, unique: str
) -> None:
    """Not JSON, an unknown property or one the protocol refuses: exit 2 and one line naming it."""
    result = consume(client, unique)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.stderr
    assert expected in errors[0]
