"""Shared fixtures: real services found by URL, skipped locally when absent, required in CI."""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator, Iterator
from urllib.parse import urlparse

import pytest
from confluent_kafka.admin import AdminClient
from redis import Redis as SyncRedis
from redis.asyncio import Redis
from support import (
    IN_CI,
    delete_declared,
    has_declared,
    reachable,
    require_service,
    test_settings,
)

from pipeline.config import Settings
from pipeline.transport import create_transport
from pipeline.transport.protocol import Transport


@pytest.fixture(scope="session")
def settings() -> Settings:
    """Test settings (see :func:`test_settings`)."""
    return test_settings()


@pytest.fixture
def redis_service(settings: Settings) -> str:
    """The Redis URL, once Redis answers."""
    url = urlparse(settings.redis.url)
    require_service("redis", url.hostname or "127.0.0.1", url.port or 6379)
    return settings.redis.url


@pytest.fixture
def kafka_service(settings: Settings) -> str:
    """The Kafka bootstrap servers, once the broker answers."""
    host, _, port = settings.kafka.bootstrap_servers.split(",")[0].rpartition(":")
    require_service("kafka", host, int(port))
    return settings.kafka.bootstrap_servers


@pytest.fixture
def postgres_service(settings: Settings) -> str:
    """The PostgreSQL URL, once the server answers."""
    url = urlparse(settings.postgres.url)
    require_service("postgres", url.hostname or "127.0.0.1", url.port or 5432)
    return settings.postgres.url


@pytest.fixture(params=["kafka", "redis"])
async def transport(request: pytest.FixtureRequest, settings: Settings) -> AsyncIterator[Transport]:
    """Each real transport in turn, for contract tests."""
    request.getfixturevalue(f"{request.param}_service")
    t = create_transport(settings, request.param)
    yield t
    await t.close()


@pytest.fixture
def unique() -> str:
    """A short unique suffix for topic, group and key names."""
    return uuid.uuid4().hex[:10]


@pytest.fixture
async def redis(redis_service: str) -> AsyncIterator[Redis]:
    """An asyncio client of the test Redis (tests isolate their keys with ``unique``)."""
    client = Redis.from_url(redis_service)
    yield client
    await client.aclose()


@pytest.fixture(autouse=True)
def _delete_declared_topics() -> Iterator[None]:
    """Delete the topics a test registered with ``support.delete_after_test``, pass or fail."""
    yield
    if has_declared():
        asyncio.run(delete_declared())


# --- Leftover topics: the suite deletes what it creates (asserted once, at the end of the run) ---

_TOPICS_AT_START = pytest.StashKey[frozenset[str] | None]()


def _topics_now() -> frozenset[str] | None:
    """Every topic on the shared Kafka and Redis, as ``kafka:NAME`` and ``redis:HASH/NAME``.

    Redis Streams topics are fields of a ``<prefix>:topics`` hash, one per key prefix, so every
    such hash is read. A service that does not answer contributes nothing; ``None`` when
    neither answers.
    """
    settings = test_settings()
    names: set[str] = set()
    answered = False
    host, _, port = settings.kafka.bootstrap_servers.split(",")[0].rpartition(":")
    if reachable(host, int(port)):
        admin = AdminClient({"bootstrap.servers": settings.kafka.bootstrap_servers})
        metadata = admin.list_topics(timeout=10)
        names.update(f"kafka:{name}" for name in metadata.topics if not name.startswith("__"))
        answered = True
    url = urlparse(settings.redis.url)
    if reachable(url.hostname or "127.0.0.1", url.port or 6379):
        with SyncRedis.from_url(settings.redis.url) as client:
            for key in client.scan_iter(match="*:topics", _type="hash", count=1000):
                hash_name = key.decode()
                names.update(f"redis:{hash_name}/{f.decode()}" for f in client.hkeys(key))
        answered = True
    return frozenset(names) if answered else None


def pytest_sessionstart(session: pytest.Session) -> None:
    """Note the topics that exist before any test runs: they are not this run's to delete."""
    session.config.stash[_TOPICS_AT_START] = _topics_now()


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Fail the run (under CI=true; report it locally) if it left topics on the shared brokers.

    Locally the brokers are shared with other people's runs, whose topics may exist for a moment
    when this one ends, so a local run reports what it finds and CI, alone on its brokers, fails.
    """
    before = session.config.stash.get(_TOPICS_AT_START, None)
    if before is None or session.config.option.collectonly:
        return
    left = (_topics_now() or frozenset()) - before
    if not left:
        return
    shown = ", ".join(sorted(left)[:40]) + (" ..." if len(left) > 40 else "")
    message = f"the run left {len(left)} topics on the shared brokers: {shown}"
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_sep("=", "leftover topics", red=True)
        reporter.write_line(message)
    if IN_CI or os.environ.get("PIPELINE_TEST_LEFTOVERS") == "fail":
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
