"""A Kafka bootstrap host that does not resolve (a typo: ``kafak:9092``) is said so, at once.

``pipeline status`` (and every command that checks the broker first) waited for librdkafka's
metadata request to time out and said "Failed while waiting for controller: Local: Timed out;
start it (`make services`)": a Kafka that is down, when the name is wrong. Redis's line for the
same typo already said "Name or service not known".
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_status_missing_topics_exit import declare

# RFC 2606: names under .invalid never resolve.
UNRESOLVED = "nosuchhost-walk.invalid"


def status(servers: str, topics: Path) -> subprocess.CompletedProcess[str]:
    """Run ``pipeline status --no-log -t kafka`` with ``servers`` as the bootstrap list."""
    return subprocess.run(
        [sys.executable, "-m", "pipeline", "status", "--no-log", "-t", "kafka"],
        capture_output=True,
        text=True,
        timeout=60,
        env={
            **os.environ,
            "PIPELINE_TOPICS_DIR": str(topics),
            "PIPELINE_KAFKA__BOOTSTRAP_SERVERS": servers,
        },
        check=False,
    )


@pytest.mark.parametrize("servers", [f"{UNRESOLVED}:9092", f"SASL_SSL://{UNRESOLVED}:9093"])
def test_a_host_that_does_not_resolve_is_named(servers: str, tmp_path: Path, unique: str) -> None:
    """Exit 1, one line naming the host and that it does not resolve, not a timeout."""
    result = status(servers, declare(tmp_path / "topics", f"walk_{unique}"))
    assert result.returncode == 1, f"{result.returncode}: {result.stdout}{result.stderr}"
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"error: cannot reach Kafka at {servers}"), line
    assert f"{UNRESOLVED!r} does not resolve" in line, line
    assert "Timed out" not in line, line


def test_one_host_that_resolves_leaves_it_to_the_broker(
    kafka_service: str, tmp_path: Path, unique: str
) -> None:
    """A list with one good address: the status is read, the bad name is librdkafka's to skip."""
    result = status(f"{UNRESOLVED}:9092,{kafka_service}", declare(tmp_path / "t", f"w_{unique}"))
    assert "does not resolve" not in result.stderr, result.stderr
    assert "pipeline status (kafka)" in result.stdout, result.stdout + result.stderr
