"""deploy/local's service scripts fail with one clear line, and never take a stranger for a service.

Every test runs the scripts against a port held by a listener of its own and a temporary state
directory, so the running services are never touched.
"""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
SCRIPTS = ROOT / "deploy" / "local"


@pytest.fixture
def stranger() -> Iterator[int]:
    """A loopback port held by a listener that accepts connections and never answers."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    try:
        yield int(sock.getsockname()[1])
    finally:
        sock.close()


def _run(
    script: str, *args: str, env: dict[str, str], tmp_path: Path
) -> subprocess.CompletedProcess[str]:
    environ = {**os.environ, "PIPELINE_STATE_DIR": str(tmp_path / "state"), **env}
    return subprocess.run(
        ["bash", str(SCRIPTS / script), *args],
        env=environ,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_unknown_subcommand_is_one_line_and_usage(tmp_path: Path) -> None:
    """services.sh with an unknown subcommand names it in one line, prints its usage and exits 2."""
    result = _run("services.sh", "restart", env={}, tmp_path=tmp_path)
    assert result.returncode == 2
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert lines[0] == "[services] error: unknown subcommand 'restart'"
    assert lines[1].startswith("usage: services.sh up|down|status")
    assert len(lines) == 2


def test_help_prints_usage(tmp_path: Path) -> None:
    """services.sh --help prints its usage and exits 0, running no service script."""
    result = _run("services.sh", "--help", env={}, tmp_path=tmp_path)
    assert result.returncode == 0
    assert result.stdout.startswith("usage: services.sh up|down|status")


@pytest.mark.parametrize(
    ("script", "variable", "name"),
    [
        ("redis.sh", "REDIS_PORT", "redis"),
        ("postgres.sh", "PGPORT", "postgresql"),
        ("kafka.sh", "KAFKA_PORT", "kafka"),
        ("s3proxy.sh", "S3PROXY_PORT", "s3proxy"),
    ],
)
def test_up_on_a_port_held_by_something_else_says_so(
    script: str, variable: str, name: str, stranger: int, tmp_path: Path
) -> None:
    """`up` on a port another program holds fails at once, naming the port and what to set."""
    result = _run(script, "up", env={variable: str(stranger)}, tmp_path=tmp_path)
    assert result.returncode == 1, result.stderr
    errors = [line for line in result.stderr.splitlines() if "error" in line]
    expected = (
        f"[services] error: 127.0.0.1:{stranger} is held by something that does not answer as"
        f" {name}: stop it or set {variable} to a free port"
    )
    assert errors == [expected]


@pytest.mark.parametrize("failing", ["install", "update"])
def test_a_package_install_that_fails_is_one_services_line(tmp_path: Path, failing: str) -> None:
    """apt-get failing (no network, no such package) ends in one [services] line, after one retry.

    apt-get is a stand-in on PATH that fails the given step: the step of the machine's package
    manager is not the unit under test, the scripts' handling of its failure is.
    """
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls"
    fake = bin_dir / "apt-get"
    fake.write_text(
        f'#!/bin/sh\necho "$*" >> {calls}\n'
        f'case "$*" in *{failing}*) echo "E: Unable to fetch" >&2; exit 100;; esac\nexit 0\n',
        encoding="utf-8",
    )
    fake.chmod(0o755)
    (tmp_path / "state").mkdir()
    if failing == "install":
        (tmp_path / "state" / ".apt-updated").touch()  # package lists from an earlier run
    script = f"source {SCRIPTS / 'common.sh'}; apt_install some-package"
    result = subprocess.run(
        ["bash", "-c", script],
        env={
            **os.environ,
            "PATH": f"{bin_dir}:{os.environ['PATH']}",
            "PIPELINE_STATE_DIR": str(tmp_path / "state"),
        },
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("[services] error: ")
    assert "some-package" in last
    steps = calls.read_text(encoding="utf-8").splitlines()
    assert any("update" in step for step in steps)  # stale lists are refreshed before giving up
