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


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[Any]:
    """Attach the scenario figures a test recorded to its report (``fault_scenario``).

    Reports travel from pytest-xdist's workers to the controlling process, which prints the
    figures at the end of the run (``tests/conftest.py``).
    """
    report = yield
    if report.when == "teardown":
        while RESULTS:
            report.user_properties.append(("fault_scenario", RESULTS.pop(0)))
    return report
