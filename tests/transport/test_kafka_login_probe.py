"""The Kafka login probe (:func:`~pipeline.transport.kafka.errors.login_problem`): one line.

The probe listens to one client for up to 3 s, polling it every 0.1 s, for what librdkafka
says of the broker's answer. What it hears is its own: an operator gets the one line it returns
(what failed, where, what to check), never librdkafka's lines, at each poll or at all.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterator

import pytest
from faults.sasl_kafka import WRONG, sasl_client, sasl_kafka

from pipeline.config import load_settings
from pipeline.transport.kafka.errors import login_problem

BOOTSTRAP = "127.0.0.1:9092"


@pytest.fixture(scope="module")
def sasl_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The bootstrap address of a private SASL broker, stopped after the module."""
    with sasl_kafka(tmp_path_factory.mktemp("sasl-kafka")) as bootstrap:
        yield bootstrap


def probed(
    caplog: pytest.LogCaptureFixture, bootstrap: str, client: dict[str, str] | None = None
) -> str | None:
    """:func:`login_problem` of a client of ``bootstrap``; nothing logged meanwhile."""
    kafka = {"bootstrap_servers": bootstrap, "client": client or {}}
    settings = load_settings(transport="kafka", kafka=kafka).kafka
    with caplog.at_level(logging.DEBUG):
        line = login_problem(settings)
    assert caplog.records == [], [r.getMessage() for r in caplog.records]
    return line


def test_a_wrong_password_is_one_line(sasl_broker: str, caplog: pytest.LogCaptureFixture) -> None:
    """The broker refused the login: its reason, its address, the keys to check, no password."""
    line = probed(caplog, sasl_broker, sasl_client(WRONG))
    assert line is not None
    assert line.startswith(f"Kafka at {sasl_broker} (PIPELINE_KAFKA__BOOTSTRAP_SERVERS) refused")
    assert "Invalid username or password" in line
    assert "sasl.password" in line
    assert "PIPELINE_KAFKA__CLIENT" in line
    assert WRONG not in line


def test_a_sasl_listener_without_sasl_is_one_line(
    sasl_broker: str, caplog: pytest.LogCaptureFixture
) -> None:
    """No SASL settings: the broker closed the connection, the line names security.protocol."""
    line = probed(caplog, sasl_broker)
    assert line is not None
    assert "closed the connection" in line
    assert "security.protocol" in line


def test_the_right_password_is_no_problem(
    sasl_broker: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The password the broker expects: no line (the probe says only a refusal)."""
    assert probed(caplog, sasl_broker, sasl_client("app-pw")) is None


def test_a_running_plain_broker_is_no_problem(caplog: pytest.LogCaptureFixture) -> None:
    """The local broker, plain text: no line."""
    assert probed(caplog, BOOTSTRAP) is None


def test_a_closed_port_is_no_problem(caplog: pytest.LogCaptureFixture) -> None:
    """Nothing listens: down, not refused; the command's own line says so."""
    with socket.socket() as holder:  # bound, not listening: connections to it are refused
        holder.bind(("127.0.0.1", 0))
        port = holder.getsockname()[1]
        assert probed(caplog, f"127.0.0.1:{port}") is None


def test_a_silent_port_is_no_problem(caplog: pytest.LogCaptureFixture) -> None:
    """A port that takes the connection and never answers: the probe's bound, no line."""
    with socket.create_server(("127.0.0.1", 0)) as silent:
        client = {"debug": "broker,protocol"}  # many lines at each poll, none passed on
        assert probed(caplog, f"127.0.0.1:{silent.getsockname()[1]}", client) is None
