"""Commands against a Kafka listener that refuses the login (SASL_PLAINTEXT, PLAIN).

librdkafka retries a refused SASL login silently: the command only timed out, and its line said
"cannot reach Kafka ... start it", for a broker that runs and answered. The line now says the
broker refused the login and which ``PIPELINE_KAFKA__CLIENT`` keys to check; with no SASL
settings at all, that the listener may expect them. The password never appears.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from faults.sasl_kafka import WRONG, sasl_client, sasl_kafka
from support import cli_environment, run_pipeline

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def sasl_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The bootstrap address of a private SASL broker, stopped after the module."""
    with sasl_kafka(tmp_path_factory.mktemp("sasl-kafka")) as bootstrap:
        yield bootstrap


def kafka_env(tmp_path: Path, bootstrap: str, client: dict[str, str] | None) -> dict[str, str]:
    """The CLI's environment on ``bootstrap``, with ``client`` as PIPELINE_KAFKA__CLIENT."""
    extra = {"PIPELINE_TRANSPORT": "kafka", "PIPELINE_KAFKA__BOOTSTRAP_SERVERS": bootstrap}
    if client is not None:
        extra["PIPELINE_KAFKA__CLIENT"] = json.dumps(client)
    return cli_environment(tmp_path, **extra)


def one_line(result: subprocess.CompletedProcess[str]) -> str:
    """Exit 1 with one stderr line, no traceback, no password anywhere; the line."""
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert WRONG not in result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


COMMANDS = [
    ("topics", "apply"),
    ("status",),
    ("tail", "messages", "-n", "1"),
    ("redrive", "messages.dlq", "--dry-run"),
    ("consume", "consumers.messages:app", "-g", "login-refused"),
]


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c[0])
def test_a_wrong_password_is_named_as_a_refused_login(
    sasl_broker: str, tmp_path: Path, command: tuple[str, ...]
) -> None:
    """A wrong sasl.password: the broker refused the login, the keys to check, not 'start it'."""
    env = kafka_env(tmp_path, sasl_broker, sasl_client(WRONG))
    line = one_line(run_pipeline(*command, env=env, cwd=Path(__file__).parents[2]))
    assert f"Kafka at {sasl_broker}" in line
    assert "refused the login" in line
    assert "sasl.username" in line
    assert "sasl.password" in line
    assert "PIPELINE_KAFKA__CLIENT" in line
    assert "make services" not in line


def test_no_sasl_settings_on_a_sasl_listener_names_security_protocol(
    sasl_broker: str, tmp_path: Path
) -> None:
    """No PIPELINE_KAFKA__CLIENT on a SASL listener: the line names security.protocol."""
    env = kafka_env(tmp_path, sasl_broker, None)
    line = one_line(run_pipeline("topics", "apply", env=env, cwd=Path(__file__).parents[2]))
    assert f"Kafka at {sasl_broker}" in line
    assert "closed the connection" in line
    assert "security.protocol" in line
    assert "PIPELINE_KAFKA__CLIENT" in line
    assert "make services" not in line
