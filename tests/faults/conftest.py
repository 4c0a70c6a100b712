"""Fixtures of the fault suite: private Redis and Kafka instances, and a scenario's cluster."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from faults.cluster import Cluster
from faults.runner import RESULTS
from faults.services import KafkaServer, PrivateRedis, kafka_libs

IN_CI = os.environ.get("CI", "").lower() == "true"


def _missing(message: str) -> None:
    if IN_CI:
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[PrivateRedis]:
    """A redis-server of this test's own, on a free port; killed at the end."""
    if shutil.which("redis-server") is None:
        _missing("redis-server is not installed; run `make services`")
    server = PrivateRedis(tmp_path / "redis")
    server.start()
    yield server
    server.kill()


@pytest.fixture(scope="session")
def private_kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaServer]:
    """One private single-node KRaft broker for the session's Kafka scenarios."""
    libs = kafka_libs()
    if libs is None or shutil.which("java") is None:
        _missing("the Kafka jars are not cached; run `make services` once")
    assert libs is not None
    server = KafkaServer(tmp_path_factory.mktemp("kafka"), libs)
    server.start()
    yield server
    server.stop()


@pytest.fixture
def make_cluster(
    request: pytest.FixtureRequest, tmp_path: Path, private_redis: PrivateRedis, unique: str
) -> Callable[..., Cluster]:
    """Build the scenario's cluster on a transport (processes start in ``runner.run``)."""

    def make(transport: str, members: int = 2, name: str = "", **options: Any) -> Cluster:
        """``name`` sets one cluster of several in a test apart (its directory and names)."""
        bootstrap = None
        if transport == "kafka":
            bootstrap = request.getfixturevalue("private_kafka").bootstrap_servers
        return Cluster(
            tmp_path / f"cluster{name}",
            transport,
            f"{unique}{name}",
            redis_url=private_redis.url,
            bootstrap_servers=bootstrap,
            members=members,
            **options,
        )

    return make


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Print each scenario's figures (recovery time, dead letters, peaks) after the run."""
    if not RESULTS:
        return
    terminalreporter.section("fault scenarios")
    for result in RESULTS:
        terminalreporter.write_line(
            f"{result['scenario']:<28} {result['transport']:<6} "
            f"accepted {result['accepted']:>4}  applied {result['applied']:>4}  "
            f"dead {result['dead']}  repeated runs {result['repeated_runs']}  "
            f"recovery {result['recovery_s']} s  "
            f"restarts {result['member_restarts']}  crashes {result['crashes']}  "
            f"rss {result['max_rss_mb']} MB  keys {result['max_redis_keys']}  "
            f"wall {result['wall_s']} s"
        )
