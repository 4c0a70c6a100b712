"""A bad setting or an unreachable broker: a short error naming the variable, no traceback."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from support import BROKER_DOWN, run_pipeline


def pipeline(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run ``pipeline ARGS`` with ``env`` added to the environment."""
    return run_pipeline(*args, env={**os.environ, **env})


@pytest.mark.parametrize(
    ("env", "variable"),
    [
        ({"PIPELINE_KAFKA__CLIENT": "not json"}, "PIPELINE_KAFKA__CLIENT"),
        ({"PIPELINE_KAFKA__CLIENT": '{"no.such.property": "1"}'}, "PIPELINE_KAFKA__CLIENT"),
        ({"PIPELINE_REDIS__URL": "redis://127.0.0.1:99999/0"}, "PIPELINE_REDIS__URL"),
        ({"PIPELINE_RUNTIME__COMMIT_INTERVAL_MS": "3000"}, "PIPELINE_RUNTIME__LIVENESS_MS"),
        (
            {"PIPELINE_KAFKA__FETCH_QUEUE_BACKOFF_MS": "-1"},
            "PIPELINE_KAFKA__FETCH_QUEUE_BACKOFF_MS",
        ),
        # Accepted before, then failing or misbehaving at run time:
        (
            {"PIPELINE_RUNTIME__PARTITION_HIGH_WATER": "200"},
            "PIPELINE_RUNTIME__PARTITION_LOW_WATER",
        ),
        ({"PIPELINE_REDIS__LEASE_MS": "1000"}, "PIPELINE_REDIS__HEARTBEAT_MS"),
        ({"PIPELINE_RUNTIME__POLL_MAX": "2000000"}, "PIPELINE_RUNTIME__POLL_MAX"),
        ({"PIPELINE_KAFKA__SESSION_TIMEOUT_MS": "4000000"}, "PIPELINE_KAFKA__SESSION_TIMEOUT_MS"),
        ({"PIPELINE_KAFKA__REQUEST_TIMEOUT_MS": "400000"}, "PIPELINE_KAFKA__REQUEST_TIMEOUT_MS"),
        (
            {"PIPELINE_THROTTLE__DYNAMIC__INTERVAL_S": "0.0001"},
            "PIPELINE_THROTTLE__DYNAMIC__INTERVAL_S",
        ),
    ],
)
def test_bad_setting_is_one_error_naming_the_variable(env: dict[str, str], variable: str) -> None:
    """A malformed setting exits 2 with one line that names its variable."""
    result = pipeline("status", "-t", "kafka", "--no-log", env=env)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert variable in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_misspelt_variable_is_named_with_the_right_one() -> None:
    """A PIPELINE_ variable close to a setting's name is reported, with the name meant."""
    result = pipeline("send", "nosuch", "--json", "{}", env={"PIPELINE_TRASNPORT": "kafka"})
    assert "PIPELINE_TRASNPORT is not a setting" in result.stderr
    assert "did you mean PIPELINE_TRANSPORT?" in result.stderr


def assert_says_where(result: subprocess.CompletedProcess[str], named: list[str]) -> None:
    """Exit 1, no traceback, at most two lines, the last an error naming every one of ``named``.

    And what to do, in the same words whichever command it was.
    """
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) <= 2, result.stderr
    assert lines[-1].startswith("error:")
    for text in named:
        assert text in lines[-1]
    assert re.search(r"start it \(`[^`]+`\) or point PIPELINE_\w+ at ", lines[-1]), lines[-1]


@pytest.mark.parametrize(("transport", "env", "named"), BROKER_DOWN)
@pytest.mark.parametrize(
    "command",
    [
        ["produce", "messages", "--value", "x"],
        ["tail", "messages"],  # a consumer alone would wait for the broker for ever
        ["tail", "messages", "--from-beginning", "--limit", "1"],
        ["topics", "list"],
        ["topics", "apply"],
        ["redrive", "messages.dlq", "--dry-run"],
    ],
)
def test_a_command_with_its_broker_down_names_address_and_variable(
    transport: str, env: dict[str, str], named: list[str], command: list[str]
) -> None:
    """Commands that use the broker reach it first: in seconds, one line saying where it is."""
    assert_says_where(pipeline(*command, "-t", transport, env=env), named)


def test_redrive_refuses_a_topic_that_is_not_a_dead_letter_topic() -> None:
    """Redrive from a declared main or retry topic exits 2 and names the lane's DLQ instead."""
    topics = str(Path(__file__).resolve().parents[2] / "topics")
    for topic in ("messages", "messages.retry.5s"):
        result = pipeline("redrive", topic, "--dry-run", env={"PIPELINE_TOPICS_DIR": topics})
        assert result.returncode == 2
        assert "Traceback" not in result.stderr
        assert "did you mean 'messages.dlq'?" in result.stderr


def test_redrive_rate_is_spelt_as_replay_spells_it() -> None:
    """Redrive takes --rate 50/s as replay does, and a rate it cannot read is exit 2."""
    bad = pipeline("redrive", "messages.dlq", "--rate", "fast", "--dry-run", env={})
    assert bad.returncode == 2
    assert "expected a positive rate such as 50/s" in bad.stderr
    for command in (["redrive", "messages.dlq"], ["replay"]):
        assert "/s" in pipeline(*command, "--help", env={"COLUMNS": "200"}).stdout


def test_ingress_on_a_busy_port_is_one_error_naming_the_port() -> None:
    """`pipeline ingress serve` on a port another process holds exits 2 naming port and variable."""
    import socket  # noqa: PLC0415 - this test's own listener

    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        result = pipeline(
            "ingress",
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--sources",
            str(Path(__file__).parents[2] / "deploy/local/sources.example.yaml"),
            env={
                "GITHUB_WEBHOOK_SECRET": "dev-secret",
                "META_APP_SECRET": "dev-secret",
                "META_VERIFY_TOKEN": "dev-token",
                "PIPELINE_INGRESS__SWEEPER__ENABLED": "false",
            },
        )
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert f"127.0.0.1:{port}" in result.stderr
    assert "PIPELINE_INGRESS__PORT" in result.stderr
    assert len(result.stderr.strip().splitlines()) <= 2, result.stderr


@pytest.mark.postgres
def test_ingress_with_a_log_database_it_cannot_open_is_one_error(postgres_service: str) -> None:
    """A wrong log-database password ends `ingress serve` with one line naming the variable."""
    url = urlsplit(postgres_service)
    wrong = url._replace(netloc=f"{url.username}:wrong-password@{url.hostname}:{url.port}")
    result = pipeline(
        "ingress",
        "serve",
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "--transport",
        "redis",
        "--sources",
        str(Path(__file__).parents[2] / "deploy/local/sources.example.yaml"),
        env={
            "GITHUB_WEBHOOK_SECRET": "dev-secret",
            "META_APP_SECRET": "dev-secret",
            "META_VERIFY_TOKEN": "dev-token",
            "PIPELINE_INGRESS__SWEEPER__ENABLED": "false",
            "PIPELINE_INGRESS__LOG_STORE": "postgres",
            "PIPELINE_POSTGRES__URL": wrong.geturl(),
        },
    )
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert "startup failed" not in result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error: cannot connect to the log database")
    assert "PIPELINE_POSTGRES__URL" in line
    assert f"{url.hostname}" in line
    assert "wrong-password" not in line


@pytest.mark.parametrize(
    ("transport", "env", "named"),
    [
        *BROKER_DOWN,
        (  # Kafka answers, but the Redis that holds the member's guard and throttles does not
            "kafka",
            {"PIPELINE_REDIS__URL": "redis://127.0.0.1:1/0"},
            ["redis://127.0.0.1:1/0", "PIPELINE_REDIS__URL"],
        ),
    ],
)
def test_consume_with_a_service_down_exits_naming_address_and_variable(
    request: pytest.FixtureRequest, transport: str, env: dict[str, str], named: list[str]
) -> None:
    """`pipeline consume` started with its broker or Redis down exits 1 in one line saying where."""
    if "PIPELINE_KAFKA__BOOTSTRAP_SERVERS" not in env and transport == "kafka":
        request.getfixturevalue("kafka_service")
    topics = str(Path(__file__).resolve().parents[2] / "topics")
    result = pipeline(
        "consume",
        "consumers.messages:app",
        "--group",
        "unreachable",
        "-t",
        transport,
        env={**env, "PIPELINE_TOPICS_DIR": topics},
    )
    assert_says_where(result, named)


@pytest.mark.parametrize(
    ("command", "env", "named"),
    [
        (
            ["throttle", "status", "org:a"],
            {"PIPELINE_REDIS__URL": "redis://127.0.0.1:1/0"},
            ["redis://127.0.0.1:1/0", "PIPELINE_REDIS__URL", "make services"],
        ),
        (
            ["throttle", "set-limit", "org:a", "5"],
            {"PIPELINE_REDIS__URL": "redis://127.0.0.1:1/0"},
            ["redis://127.0.0.1:1/0", "PIPELINE_REDIS__URL", "make services"],
        ),
        (
            ["schemas", "ls"],
            {"PIPELINE_REGISTRY__URL": "http://reader:secret@127.0.0.1:1"},
            ["http://reader:***@127.0.0.1:1", "PIPELINE_REGISTRY__URL", "pipeline registry serve"],
        ),
    ],
)
def test_a_command_whose_service_is_down_says_where_and_what_to_do(
    command: list[str], env: dict[str, str], named: list[str]
) -> None:
    """The throttle and schema commands end in one line: the service, its address, the fix."""
    result = pipeline(*command, env=env)
    assert_says_where(result, named)
    assert result.stderr.startswith("error: cannot reach ")
    assert "secret" not in result.stderr


def test_an_error_naming_a_path_with_brackets_prints_the_path_as_it_is(tmp_path: Path) -> None:
    """The error line is text, not markup: ``[bold]`` in a path is printed, not swallowed.

    Before, the console read the message as markup, so the line named another path than the
    one at fault.
    """
    missing = tmp_path / "no[bold]such[/bold]dir"
    result = pipeline("capacity", "messages", env={"PIPELINE_TOPICS_DIR": str(missing)})
    assert result.returncode == 2, result.stderr
    assert str(missing) in result.stderr
