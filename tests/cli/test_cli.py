"""The operator CLI end to end: real processes against real brokers, and clear failures."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from contract.helpers import make_topic
from support import delete_topics_after_test, test_settings

from pipeline.transport import create_transport

PIPELINE = [sys.executable, "-m", "pipeline"]


def run(
    *args: str, env: dict[str, str] | None = None, timeout_s: float = 90
) -> subprocess.CompletedProcess[str]:
    """Run ``pipeline ARGS`` and capture its output."""
    return subprocess.run(
        [*PIPELINE, *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env={**os.environ, **(env or {})},
        check=False,
    )


def _declare(tmp_path: Path, name: str) -> Path:
    (tmp_path / f"{name}.yaml").write_text(f"name: {name}\npartitions: 3\nretry:\n  tiers: [5s]\n")
    return tmp_path


@pytest.mark.parametrize("name", ["kafka", "redis"])
def test_apply_produce_and_tail_round_trip(
    name: str, unique: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Topics apply creates the topics; produce prints its receipt; tail prints the message."""
    request.getfixturevalue(f"{name}_service")
    topic = f"cli_{unique}"
    directory = _declare(tmp_path, topic)
    delete_topics_after_test(test_settings(), name, [topic, f"{topic}.retry.5s", f"{topic}.dlq"])
    dry = run("topics", "apply", str(directory), "--dry-run", "-t", name)
    assert dry.returncode == 0, dry.stderr
    assert f"(dry run) create {topic}.retry.5s" in dry.stdout
    applied = run("topics", "apply", str(directory), "-t", name)
    assert applied.returncode == 0, applied.stderr
    assert "applied 3 change(s)" in applied.stdout
    again = run("topics", "apply", str(directory), "-t", name)
    assert "already match" in again.stdout
    produced = run(
        "produce", topic, "--key", "conv-1", "--value", "hello", "-H", "tenant=acme", "-t", name
    )
    assert produced.returncode == 0, produced.stderr
    receipt = json.loads(produced.stdout)
    assert receipt == {
        "topic": topic,
        "partition": receipt["partition"],
        "offset": 0,
        "event_id": receipt["event_id"],
    }
    assert len(receipt["event_id"]) == 32  # a new event id, as the ingress gives each event
    tailed = run("tail", topic, "--from-beginning", "--limit", "1", "--json", "-t", name)
    assert tailed.returncode == 0, tailed.stderr
    row = json.loads(tailed.stdout)
    assert row["key"] == "conv-1"
    assert row["value"] == "hello"
    assert row["headers"] == {"tenant": "acme", "pl-event-id": receipt["event_id"]}
    assert row["partition"] == receipt["partition"]
    listed = run("topics", "list", "--json", "-t", name)
    counts = {r["topic"]: r["messages"] for r in map(json.loads, listed.stdout.splitlines())}
    assert counts[topic] == 1
    assert counts[f"{topic}.dlq"] == 0


def test_malformed_yaml_names_the_file(tmp_path: Path) -> None:
    """A broken declaration exits 2 with the file name, before any broker is contacted."""
    (tmp_path / "bad.yaml").write_text("name: x\npartitions: [oops\n")
    result = run("topics", "apply", str(tmp_path), "--dry-run")
    assert result.returncode == 2
    assert "bad.yaml" in result.stderr
    assert "Traceback" not in result.stderr


def test_bad_configuration_names_the_setting() -> None:
    """An invalid PIPELINE_ variable exits 2 naming the variable."""
    result = run("topics", "list", env={"PIPELINE_TRANSPORT": "rabbitmq"})
    assert result.returncode == 2
    assert "PIPELINE_TRANSPORT" in result.stderr
    assert "Traceback" not in result.stderr


def test_produce_needs_exactly_one_value_source() -> None:
    """Produce without --value or --file is a usage error."""
    result = run("produce", "anything", "--key", "k")
    assert result.returncode == 2
    assert "exactly one of --value or --file" in result.stderr


@pytest.mark.parametrize("name", ["kafka", "redis"])
def test_unknown_topic_exits_non_zero(
    name: str, unique: str, request: pytest.FixtureRequest
) -> None:
    """Producing to an undeclared topic exits 1 with advice, no traceback."""
    request.getfixturevalue(f"{name}_service")
    result = run("produce", f"missing-{unique}", "--value", "x", "-t", name)
    assert result.returncode == 1
    assert "topics apply" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("name", ["kafka", "redis"])
def test_unreachable_broker_exits_non_zero(name: str) -> None:
    """A broker that does not answer gives a one-line error and exit 1, not a hang."""
    env = {
        "PIPELINE_KAFKA__BOOTSTRAP_SERVERS": "127.0.0.1:1",
        "PIPELINE_KAFKA__REQUEST_TIMEOUT_MS": "1000",
        "PIPELINE_REDIS__URL": "redis://127.0.0.1:1/0",
    }
    result = run("produce", "t", "--value", "x", "-t", name, env=env, timeout_s=60)
    assert result.returncode == 1
    assert "error:" in result.stderr
    assert "Traceback" not in result.stderr


async def test_topics_list_into_a_pipe_keeps_long_names_whole(
    redis_service: str, unique: str
) -> None:
    """Piped, `topics list` prints a 90-character topic name whole instead of cutting it at 80."""
    del redis_service
    topic = f"list_{unique}_" + "x" * 74
    transport = create_transport(test_settings(), "redis")
    try:
        await make_topic(transport, topic, 1)
    finally:
        await transport.close()
    listed = run("topics", "list", "-t", "redis")
    assert listed.returncode == 0, listed.stderr
    assert topic in listed.stdout


def _command_paths(command: object, prefix: list[str]) -> list[list[str]]:
    paths = [prefix]
    for name, sub in getattr(command, "commands", {}).items():
        paths += _command_paths(sub, [*prefix, name])
    return paths


def test_every_help_reflows_its_paragraphs_and_shows_no_rst_quotes() -> None:
    """At 80 columns a docstring's paragraph is reflowed as one, not broken where it was typed."""
    import typer  # noqa: PLC0415 - only this test needs the command tree
    from typer.testing import CliRunner  # noqa: PLC0415

    from pipeline.cli.commands import app  # noqa: PLC0415

    runner = CliRunner()
    paths = _command_paths(typer.main.get_command(app), [])
    assert len(paths) > 20
    for path in paths:
        result = runner.invoke(app, [*path, "--help"], env={"COLUMNS": "80", "NO_COLOR": "1"})
        assert result.exit_code == 0, (path, result.output)
        assert "``" not in result.output, path
    replay = runner.invoke(app, ["replay", "--help"], env={"COLUMNS": "200", "NO_COLOR": "1"})
    assert (
        "Without --state, rows already processed are skipped (--include-processed takes them too)."
        in replay.output
    )
