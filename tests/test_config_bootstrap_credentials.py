"""A Kafka bootstrap list that librdkafka cannot use is refused at start in one plain line.

``PIPELINE_KAFKA__BOOTSTRAP_SERVERS=user:pw@kafka:9092`` was accepted: librdkafka took
``user:pw@kafka`` for a host name, logged it (password and all) each time it failed to resolve
it, and every command ended seconds later in "cannot reach Kafka at user:pw@kafka:9092", the
password echoed. A login belongs in ``PIPELINE_KAFKA__CLIENT`` (``sasl.*``). A list with spaces
or an empty entry got pydantic's regular expression for a reason; a protocol prefix librdkafka
takes (``PLAINTEXT://``, ``sasl_ssl://``) stays valid, one it does not (``http://``) is named.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from config_helpers import config_line
from support import cli_environment, run_pipeline

from pipeline.config import KafkaSettings

_SECRET = "Qv8" + "rTn" + "Wd3"
_VARIABLE = "PIPELINE_KAFKA__BOOTSTRAP_SERVERS"
_LOGIN = (
    "a user or password in the bootstrap list (librdkafka takes it for part of a host name);"
    " list host:port only and give the login in PIPELINE_KAFKA__CLIENT: security.protocol"
    " (SASL_SSL or SASL_PLAINTEXT), sasl.mechanism, sasl.username and sasl.password"
)


def _line(monkeypatch: pytest.MonkeyPatch, value: str) -> str:
    return config_line(monkeypatch, _VARIABLE, value)


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        (f"app:{_SECRET}@kafka:9092", "***@kafka:9092"),
        (f"app:{_SECRET}@127.0.0.1:9092", "***@127.0.0.1:9092"),
        (f"app:{_SECRET}@kafka", "***@kafka"),
        (f"{_SECRET}@kafka:9092", "***@kafka:9092"),
        (f"kafka1:9092,app:{_SECRET}@kafka2:9092", "***@kafka2:9092"),  # all before the @
        (f"SASL_SSL://app:{_SECRET}@kafka:9093", None),
    ],
    ids=["host", "address", "no-port", "token-only", "in-a-list", "with-protocol"],
)
def test_a_login_in_the_bootstrap_list_is_refused_without_the_password(
    monkeypatch: pytest.MonkeyPatch, value: str, shown: str | None
) -> None:
    """The line says what is wrong and where the login goes; the password never shows.

    The echo hides all before the last @ (a list's first hosts too), or shows the length.
    """
    line = _line(monkeypatch, value)
    assert _SECRET not in line, line.replace(_SECRET, "<password>")
    got = f"{shown!r}" if shown is not None else f"{len(value)} characters, not shown"
    assert line == f"invalid configuration: {_VARIABLE}: {_LOGIN} (got {got})"


def test_the_login_line_keeps_its_words_when_they_match_the_user(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A user named 'user' or 'sasl' hides nothing of the advice (``sasl.***name``)."""
    line = _line(monkeypatch, f"user:{_SECRET}@kafka:9092")
    assert line == f"invalid configuration: {_VARIABLE}: {_LOGIN} (got '***@kafka:9092')"


_EMPTY = (
    "an empty entry in the bootstrap list (two commas together, or one at an end);"
    " remove it: host:port[,host:port...]"
)
_HTTP = (
    "'http' is not a protocol librdkafka takes in the bootstrap list: write"
    " host:port, or PLAINTEXT://, SSL://, SASL_PLAINTEXT:// or SASL_SSL:// before it"
)
_FORM = (
    "expected host:port[,host:port...], each entry with its port (kafka:9092),"
    " IPv6 addresses in brackets ([::1]:9092), maybe after a protocol (SASL_SSL://)"
)


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (
            "kafka1:9092, kafka2:9092",
            "whitespace in the bootstrap list; separate host:port entries with commas only",
        ),
        ("kafka1:9092,,kafka2:9092", _EMPTY),
        ("kafka1:9092,", _EMPTY),
        ("http://kafka:9092", _HTTP),
        ("kafka", _FORM),
        ("kafka:99999", "port 99999 is out of range (1-65535)"),
    ],
    ids=["space", "empty-entry", "trailing-comma", "http-scheme", "no-port", "port-range"],
)
def test_a_malformed_list_is_told_plainly(
    monkeypatch: pytest.MonkeyPatch, value: str, reason: str
) -> None:
    """Each mistake gets its own reason, not the regular expression; the value shown as given."""
    line = _line(monkeypatch, value)
    assert line == f"invalid configuration: {_VARIABLE}: {reason} (got {value!r})"


@pytest.mark.parametrize(
    "value",
    [
        "127.0.0.1:9092",
        "kafka-0.kafka.svc.cluster.local:9092,kafka-1.kafka.svc.cluster.local:9092",
        "PLAINTEXT://kafka:9092",
        "plaintext://kafka:9092,PLAINTEXT://kafka2:9092",
        "SASL_SSL://kafka:9093",
        "[::1]:9092",
        "PLAINTEXT://[fe80::1]:9092",
        "kafka_1:9092",
    ],
)
def test_what_librdkafka_takes_stays_valid(value: str) -> None:
    """A protocol prefix, IPv6 in brackets, several hosts: accepted and kept as given."""
    assert KafkaSettings(bootstrap_servers=value).bootstrap_servers == value


@pytest.mark.parametrize("command", [("topics", "list"), ("status",)])
def test_a_command_stops_at_once_with_the_line(tmp_path: Path, command: tuple[str, ...]) -> None:
    """The commands stop before any connection (exit 2), the password in none of their output."""
    env = cli_environment(
        tmp_path,
        PIPELINE_TRANSPORT="kafka",
        **{_VARIABLE: f"app:{_SECRET}@127.0.0.1:9092"},
    )
    result = run_pipeline(*command, env=env)
    said = result.stdout + result.stderr
    assert _SECRET not in said, said.replace(_SECRET, "<password>")
    assert result.returncode == 2, said
    assert f"{_VARIABLE}: a user or password in the bootstrap list" in said, said
    assert "cannot reach Kafka" not in said, said
