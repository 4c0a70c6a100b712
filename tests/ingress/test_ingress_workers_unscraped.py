"""``ingress serve --workers N`` without a metrics port: no worker asks for metrics none serves.

Without ``PIPELINE_INGRESS__METRICS_PORT`` a worker answers ``/metrics`` 404 (the shared
webhook port would mix the workers' counters), yet each still refreshed the snapshot every
interval: the group lag asked of the broker, the backlog of the log store, from the start. With
Kafka down, each worker logged its own ``metrics source group_lag timed out`` 10 s after it
listened, and again every 25 s: N identical warnings, the supervisor having said once already
that the broker did not answer. A worker's snapshot is now refreshed only where it is served.
"""

from __future__ import annotations

import socket
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from ingress.helpers import listened_then_stopped
from support import BROKER_DOWN, cli_environment

pytestmark = pytest.mark.postgres

START_S = 60.0
"""The longest a start may take to listen; a bound, not a wait."""
REFRESHED = "metrics refreshed in process"
SPY = """
import os
import sys

from pipeline.observability import server

refresh = server.MetricsServer.refresh_once


async def counted(self):
    print(REFRESHED, os.getpid(), file=sys.stderr, flush=True)
    return await refresh(self)


server.MetricsServer.refresh_once = counted
""".replace("REFRESHED", repr(REFRESHED))
"""A ``sitecustomize`` that says on stderr, with its process id, each refresh of a snapshot
(the supervisor's and every spawned worker's interpreter load it)."""


@pytest.fixture
def spied_env(tmp_path: Path, postgres_service: str) -> Iterator[dict[str, str]]:
    """An ingress of one source on Kafka, the PostgreSQL log, every process's refreshes said."""
    spy = tmp_path / "spy"
    spy.mkdir()
    (spy / "sitecustomize.py").write_text(SPY, encoding="utf-8")
    (tmp_path / "sources.yaml").write_text(
        "sources:\n  plain:\n    scheme: none\n    topic: messages\n", encoding="utf-8"
    )
    schema = f"unscraped_{uuid.uuid4().hex[:12]}"
    yield cli_environment(
        tmp_path,
        PYTHONPATH=str(spy),
        PIPELINE_TRANSPORT="kafka",
        PIPELINE_INGRESS__SWEEPER__ENABLED="false",
        PIPELINE_INGRESS__LOG_STORE="postgres",
        PIPELINE_POSTGRES__URL=postgres_service,
        PIPELINE_INGRESS__POSTGRES_SCHEMA=schema,
    )
    with psycopg.connect(postgres_service, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def refreshing_processes(env: dict[str, str], cwd: Path) -> set[str]:
    """Start two workers, stop them once listening: the processes that refreshed a snapshot.

    A worker's refresher, when it has one, starts with the ingress: its first refresh is
    under way before the worker tells the supervisor it listens, so before the line is read.
    """
    serve = [sys.executable, "-m", "pipeline", "ingress", "serve", "--port", "0", "--workers", "2"]
    listened, ended = listened_then_stopped(serve, env, cwd, START_S)
    assert listened, ended.stderr
    assert ended.returncode == 0, ended.stderr
    return {line.split()[-1] for line in ended.stderr.splitlines() if line.startswith(REFRESHED)}


def consecutive_free_ports(count: int) -> int:
    """The first of ``count`` consecutive ports nothing holds on 127.0.0.1 now."""
    for _ in range(50):
        with socket.create_server(("127.0.0.1", 0)) as first:
            start = int(first.getsockname()[1])
        if all(bindable(port) for port in range(start, start + count)):
            return start
    raise AssertionError(f"no {count} consecutive free ports")


def bindable(port: int) -> bool:
    """Whether ``port`` of 127.0.0.1 can be bound now."""
    try:
        with socket.create_server(("127.0.0.1", port)):
            return True
    except OSError:
        return False


@pytest.mark.parametrize(
    "kafka", ["127.0.0.1:9092", BROKER_DOWN[0][1]["PIPELINE_KAFKA__BOOTSTRAP_SERVERS"]]
)
def test_workers_without_a_metrics_port_refresh_no_snapshot(
    spied_env: dict[str, str], tmp_path: Path, kafka: str
) -> None:
    """Kafka up or at a closed port: no worker asks the broker (or the log) for metrics."""
    env = spied_env | {"PIPELINE_KAFKA__BOOTSTRAP_SERVERS": kafka}
    assert refreshing_processes(env, tmp_path) == set()


def test_workers_with_a_metrics_port_each_refresh_their_own(
    spied_env: dict[str, str], tmp_path: Path
) -> None:
    """``PIPELINE_INGRESS__METRICS_PORT=P``: worker i serves its snapshot on P + i, refreshed."""
    env = spied_env | {
        "PIPELINE_KAFKA__BOOTSTRAP_SERVERS": "127.0.0.1:9092",
        "PIPELINE_INGRESS__METRICS_PORT": str(consecutive_free_ports(2)),
    }
    assert len(refreshing_processes(env, tmp_path)) == 2
