"""The ingress commands given bad input or a service that is down: one line and an exit code.

Each command runs in a subprocess, as an operator runs it. A service that is down is a closed
loopback port named in the environment; nothing is created on the running services.
"""

from __future__ import annotations

import asyncio
import re
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from logstore.helpers import FakeClock, new_row
from support import BROKER_DOWN, cli_environment, run_pipeline

from pipeline.logstore.sqlite import SqliteLogStore

CLOSED_POSTGRES = "postgresql://pipeline:not-a-secret@127.0.0.1:1/pipeline"


def environment(tmp_path: Path, **extra: str) -> dict[str, str]:
    """:func:`support.cli_environment` with the sweeper off."""
    return cli_environment(tmp_path, **{"PIPELINE_INGRESS__SWEEPER__ENABLED": "false", **extra})


def pipeline(tmp_path: Path, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run ``pipeline ARGS`` in ``tmp_path`` with exactly ``env``."""
    return run_pipeline(*args, env=env, cwd=tmp_path)


def one_line(result: subprocess.CompletedProcess[str], code: int) -> str:
    """The single stderr line of ``result``, after checking its exit code and no traceback."""
    assert result.returncode == code, result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: "), lines[0]
    return lines[0]


def seed_one_due_row(db: Path) -> None:
    """A log holding one row received two hours ago and never produced (due for a sweep)."""

    async def seed() -> None:
        clock = FakeClock(start_s=time.time() - 7200)
        store = SqliteLogStore(db, clock=clock)
        await store.open()
        try:
            await store.insert(new_row(0, clock))
        finally:
            await store.close()

    asyncio.run(seed())


def row_bookkeeping(db: Path) -> tuple[str, int, int, int]:
    """State, produce attempts, replay count and claim lease of the log's only row."""
    with sqlite3.connect(db) as conn:
        (row,) = conn.execute(
            "SELECT state, produce_attempts, replay_count, lease_until_ms FROM ingress_log"
        ).fetchall()
    return row


def free_port() -> int:
    """A port nothing listens on now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.mark.parametrize("memory", ["5x", "0", "-1d"])
def test_an_idempotency_memory_that_is_no_duration_is_one_line(tmp_path: Path, memory: str) -> None:
    """`replay --idempotency-memory 5x` (or 0, -1d) exits 2 naming the option, not a ValueError."""
    seed_one_due_row(tmp_path / "ingress.db")
    result = pipeline(
        tmp_path, "replay", f"--idempotency-memory={memory}", env=environment(tmp_path)
    )
    line = one_line(result, 2)
    assert "--idempotency-memory" in line
    assert repr(memory) in line


@pytest.mark.parametrize("workers", ["1", "2"])
@pytest.mark.parametrize("port", ["70000", "-1"])
def test_a_port_out_of_range_is_one_line_naming_the_option(
    tmp_path: Path, port: str, workers: str
) -> None:
    """`ingress serve --port 70000` exits 2 naming --port, as `registry serve` refuses it."""
    env = environment(
        tmp_path,
        PIPELINE_INGRESS__LOG_STORE="postgres",  # --workers 2 needs it; never reached
        PIPELINE_POSTGRES__URL=CLOSED_POSTGRES,
    )
    result = pipeline(tmp_path, "ingress", "serve", f"--port={port}", "--workers", workers, env=env)
    line = one_line(result, 2)
    assert "--port" in line
    assert port in line
    assert "0 to 65535" in line


@pytest.mark.parametrize("workers", ["1", "2"])
@pytest.mark.parametrize(
    ("host", "says"),
    [
        ("no-such-host.invalid", "cannot resolve"),
        ("999.1.1.1", "not a valid IP address"),
    ],
)
def test_a_host_that_cannot_be_bound_says_why(
    tmp_path: Path, host: str, says: str, workers: str
) -> None:
    """An unresolvable or invalid --host is named as such, not as a port another process holds."""
    env = environment(
        tmp_path,
        PIPELINE_INGRESS__LOG_STORE="postgres",
        PIPELINE_POSTGRES__URL=CLOSED_POSTGRES,
    )
    port = str(free_port())
    args = ["ingress", "serve", "--host", host, "--port", port, "--workers", workers]
    line = one_line(pipeline(tmp_path, *args, env=env), 2)
    assert says in line
    assert f"{host}:{port}" in line
    assert "PIPELINE_INGRESS__HOST (or --host)" in line
    assert "another process" not in line


def test_workers_with_the_log_database_down_say_so_once(tmp_path: Path) -> None:
    """`ingress serve --workers 2` with PostgreSQL down: one line, exit 1, no worker's traceback.

    The supervisor opens the log database before it starts any worker, as a single ingress
    opens it before it listens.
    """
    env = environment(
        tmp_path,
        PIPELINE_INGRESS__LOG_STORE="postgres",
        PIPELINE_POSTGRES__URL=CLOSED_POSTGRES,
    )
    result = pipeline(tmp_path, "ingress", "serve", "--port", "0", "--workers", "2", env=env)
    line = one_line(result, 1)
    assert line.startswith("error: cannot connect to the log database")
    assert "PIPELINE_POSTGRES__URL" in line
    assert "not-a-secret" not in line


WORKERS_WITHOUT_PREFLIGHT = """
import sys
from pathlib import Path
from pipeline.ingress.workers import Supervisor, WorkerArgs
if __name__ == "__main__":
    args = WorkerArgs("127.0.0.1", 0, None, None, "WARNING")
    sys.exit(Supervisor(2, args, lambda host, port: None).run())
"""


def test_a_worker_that_cannot_start_exits_with_its_line_and_no_traceback(tmp_path: Path) -> None:
    """A worker whose start fails after the supervisor's checks (the database gone meanwhile).

    Before, each worker printed its line, then ``Process ingress-worker-N: Traceback ...
    typer.exceptions.Exit: 1``: the worker caught click's Exit, which typer's no longer is.
    """
    env = environment(
        tmp_path,
        PIPELINE_INGRESS__LOG_STORE="postgres",
        PIPELINE_POSTGRES__URL=CLOSED_POSTGRES,
    )
    result = subprocess.run(
        [sys.executable, "-c", WORKERS_WITHOUT_PREFLIGHT],
        capture_output=True,
        text=True,
        timeout=90,
        env=env,
        cwd=tmp_path,
        check=False,
    )
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    errors = {line for line in result.stderr.splitlines() if line.startswith("error: ")}
    assert len(errors) == 1, result.stderr
    assert errors.pop().startswith("error: cannot connect to the log database")


def test_a_metrics_source_whose_broker_is_down_logs_one_warning(tmp_path: Path) -> None:
    """With Redis down the ingress still starts; the failed group-lag reading is one warning line.

    Before, it was logged at ERROR with the chained tracebacks of redis-py and the transport.
    """
    env = environment(
        tmp_path, PIPELINE_TRANSPORT="redis", PIPELINE_REDIS__URL="redis://127.0.0.1:1/0"
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "pipeline", "ingress", "serve", "--port", "0"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: list[str] = []
    seen = threading.Event()

    def read() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append(line.rstrip("\n"))
            if "metrics source group_lag" in line:
                seen.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert seen.wait(60), "\n".join(lines)
        time.sleep(0.5)  # whatever the same refresh logs after that line
    finally:
        proc.terminate()
        proc.communicate(timeout=30)
        reader.join(5)
    text = "\n".join(lines)
    assert "Traceback" not in text
    (failed,) = [line for line in lines if "metrics source group_lag" in line]
    assert re.search(r"\bWARNING\b", failed), failed
    assert "127.0.0.1:1" in failed


@pytest.mark.parametrize(("transport", "down", "named"), BROKER_DOWN)
@pytest.mark.parametrize("command", [["sweep"], ["replay"]])
def test_sweep_and_replay_reach_the_broker_before_touching_rows(
    tmp_path: Path,
    transport: str,
    down: dict[str, str],
    named: list[str],
    command: list[str],
) -> None:
    """With the broker down, one line saying where it is, exit 1, and the due row untouched.

    Before, `sweep` printed ``failed 1`` with no reason (and, within the claim lease, ``failed 0``
    and exit 0), and `replay` went through the selection to print ``BrokerUnavailable: 1``.
    """
    db = tmp_path / "ingress.db"
    seed_one_due_row(db)
    env = environment(tmp_path, PIPELINE_TRANSPORT=transport, **down)
    for _ in range(2):  # the second within the first one's claim lease
        line = one_line(pipeline(tmp_path, *command, env=env), 1)
        for text in named:
            assert text in line
        assert re.search(r"start it \(`[^`]+`\) or point PIPELINE_\w+ at ", line), line
    assert row_bookkeeping(db) == ("received", 0, 0, 0)


@pytest.mark.parametrize(
    "command",
    [["purge"], ["replay"], ["replay", "--dry-run"], ["sweep"]],
    ids=["purge", "replay", "replay-dry-run", "sweep"],
)
def test_an_operator_command_refuses_a_log_database_that_does_not_exist(
    tmp_path: Path, command: list[str]
) -> None:
    """A mistyped PIPELINE_INGRESS__SQLITE_PATH is one line, exit 2, and nothing is created.

    Before, `purge` created the directory and an empty database and said ``purged 0 rows``.
    Services are pointed at closed ports: the database is checked before any of them.
    """
    missing = tmp_path / "typo" / "dir" / "x.db"
    env = environment(
        tmp_path,
        PIPELINE_TRANSPORT="redis",
        PIPELINE_REDIS__URL="redis://127.0.0.1:1/0",
        PIPELINE_INGRESS__SQLITE_PATH=str(missing),
    )
    line = one_line(pipeline(tmp_path, *command, env=env), 2)
    assert "PIPELINE_INGRESS__SQLITE_PATH" in line
    assert str(missing) in line
    assert not (tmp_path / "typo").exists()


def test_purge_has_no_transport_option(tmp_path: Path) -> None:
    """`purge` only touches the log store: it offers no --transport that would do nothing."""
    env = environment(tmp_path, COLUMNS="200")
    help_text = pipeline(tmp_path, "purge", "--help", env=env).stdout
    assert "--older-than" in help_text
    assert "--transport" not in help_text
    seed_one_due_row(tmp_path / "ingress.db")
    result = pipeline(tmp_path, "purge", "-t", "kafka", env=env)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("option", ["--tenant", "--source", "--id"])
@pytest.mark.parametrize("store", ["sqlite", "postgres"])
def test_a_replay_filter_typed_with_bytes_not_utf8_is_one_line(
    tmp_path: Path, request: pytest.FixtureRequest, store: str, option: str
) -> None:
    """A `replay` filter holding bytes that are not UTF-8 is one line naming it, exit 2."""
    db = tmp_path / "ingress.db"
    seed_one_due_row(db)
    extra = {"PIPELINE_INGRESS__LOG_STORE": store}
    if store == "postgres":
        extra["PIPELINE_POSTGRES__URL"] = request.getfixturevalue("postgres_service")
    env = environment(tmp_path, PIPELINE_TRANSPORT="redis", **extra)
    typed = b"a\xffb".decode(errors="surrogateescape")  # how Python hands `$'a\xffb'` over
    line = one_line(pipeline(tmp_path, "replay", "--dry-run", option, typed, env=env), 2)
    assert f"{option} 'a\\xffb'" in line
    assert "UTF-8" in line
    assert row_bookkeeping(db) == ("received", 0, 0, 0)
