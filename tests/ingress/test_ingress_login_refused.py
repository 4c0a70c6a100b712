"""``pipeline ingress serve`` against a broker that refuses its login: exit 2 with one line.

A broker that is down only delays production (the log is durable, the sweeper produces later),
so the ingress serves into its log. A refused password does not heal by waiting: the ingress
served for ever, accepting webhooks it never produced, with only metrics warnings to say why.
It now stops at start with the service, its address (password hidden) and the setting to check.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from faults.sasl_kafka import WRONG, sasl_client, sasl_kafka
from ingress.helpers import PIPELINE, listened_then_stopped
from ingress.redis_server import password_redis
from support import BROKER_DOWN, cli_environment

pytestmark = pytest.mark.slow

RIGHT = "right-password-7c41"
POSTGRES = "postgresql://pipeline:pipeline@127.0.0.1:5432/pipeline"
START_S = 60.0
"""The longest a start may take to listen or to exit; a bound, not a wait."""


@pytest.fixture(scope="module")
def sasl_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The bootstrap address of a private SASL broker, stopped after the module."""
    with sasl_kafka(tmp_path_factory.mktemp("sasl-kafka")) as bootstrap:
        yield bootstrap


def started(
    env: dict[str, str], cwd: Path, *options: str
) -> tuple[bool, subprocess.CompletedProcess[str]]:
    """Start ``pipeline ingress serve OPTIONS``: whether it listened, how it ended (stopped)."""
    argv = [str(PIPELINE), "ingress", "serve", *options, "--port", "0"]
    return listened_then_stopped(argv, env, cwd, START_S)


def refused_line(env: dict[str, str], cwd: Path, secret: str, *options: str) -> str:
    """The one stderr line of an ingress that must not listen but exit 2, the secret unsaid."""
    listened, result = started(env, cwd, *options)
    assert not listened, f"the ingress served on a refused login: {result.stderr}"
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert secret not in result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: "), lines[0]
    return lines[0]


def test_a_wrong_redis_password_stops_the_start(tmp_path: Path) -> None:
    """PIPELINE_TRANSPORT=redis with a password Redis refuses: exit 2, Redis's address hidden."""
    with password_redis(RIGHT) as port:
        url = f"redis://:{WRONG}@127.0.0.1:{port}/0"
        env = cli_environment(tmp_path, PIPELINE_TRANSPORT="redis", PIPELINE_REDIS__URL=url)
        line = refused_line(env, tmp_path, WRONG)
    assert f"Redis at redis://***@127.0.0.1:{port}/0 (PIPELINE_REDIS__URL)" in line
    assert "refused the credentials" in line
    assert "make services" not in line


@pytest.mark.postgres
def test_a_wrong_redis_password_stops_the_workers_start(tmp_path: Path) -> None:
    """``--workers 2``: the supervisor says it once, exit 2, before any worker starts."""
    with password_redis(RIGHT) as port:
        url = f"redis://:{WRONG}@127.0.0.1:{port}/0"
        env = cli_environment(
            tmp_path,
            PIPELINE_TRANSPORT="redis",
            PIPELINE_REDIS__URL=url,
            PIPELINE_INGRESS__LOG_STORE="postgres",
            PIPELINE_POSTGRES__URL=POSTGRES,
        )
        line = refused_line(env, tmp_path, WRONG, "--workers", "2")
    assert f"Redis at redis://***@127.0.0.1:{port}/0 (PIPELINE_REDIS__URL)" in line
    assert "refused the credentials" in line


def test_the_right_redis_password_serves(tmp_path: Path) -> None:
    """The password Redis expects: the ingress listens (the check refuses only a refusal)."""
    with password_redis(RIGHT) as port:
        url = f"redis://:{RIGHT}@127.0.0.1:{port}/0"
        env = cli_environment(tmp_path, PIPELINE_TRANSPORT="redis", PIPELINE_REDIS__URL=url)
        listened, result = started(env, tmp_path)
    assert listened, result.stderr


def kafka_env(tmp_path: Path, bootstrap: str, password: str) -> dict[str, str]:
    """The ingress's environment on the SASL broker, logging in as ``app`` with ``password``."""
    return cli_environment(
        tmp_path,
        PIPELINE_TRANSPORT="kafka",
        PIPELINE_KAFKA__BOOTSTRAP_SERVERS=bootstrap,
        PIPELINE_KAFKA__CLIENT=json.dumps(sasl_client(password)),
    )


def test_a_wrong_sasl_password_stops_the_start(sasl_broker: str, tmp_path: Path) -> None:
    """A wrong sasl.password: exit 2, the broker refused the login, the keys to check."""
    line = refused_line(kafka_env(tmp_path, sasl_broker, WRONG), tmp_path, WRONG)
    assert f"Kafka at {sasl_broker} (PIPELINE_KAFKA__BOOTSTRAP_SERVERS)" in line
    assert "refused the login" in line
    assert "sasl.password" in line
    assert "PIPELINE_KAFKA__CLIENT" in line


def test_no_sasl_settings_on_a_sasl_listener_stops_the_start(
    sasl_broker: str, tmp_path: Path
) -> None:
    """No PIPELINE_KAFKA__CLIENT on a SASL listener: exit 2, the line names security.protocol."""
    env = cli_environment(
        tmp_path, PIPELINE_TRANSPORT="kafka", PIPELINE_KAFKA__BOOTSTRAP_SERVERS=sasl_broker
    )
    line = refused_line(env, tmp_path, WRONG)
    assert f"Kafka at {sasl_broker} (PIPELINE_KAFKA__BOOTSTRAP_SERVERS)" in line
    assert "closed the connection" in line
    assert "security.protocol" in line


def test_the_right_sasl_password_serves(sasl_broker: str, tmp_path: Path) -> None:
    """The password the broker expects: the ingress listens."""
    listened, result = started(kafka_env(tmp_path, sasl_broker, "app-pw"), tmp_path)
    assert listened, result.stderr


@pytest.mark.parametrize(("transport", "extra", "_named"), BROKER_DOWN, ids=lambda v: str(v)[:5])
def test_a_broker_down_still_serves(
    tmp_path: Path, transport: str, extra: dict[str, str], _named: list[str]
) -> None:
    """A broker that does not answer: the ingress serves into its log, as before."""
    env = cli_environment(tmp_path, PIPELINE_TRANSPORT=transport, **extra)
    listened, result = started(env, tmp_path)
    assert listened, result.stderr
