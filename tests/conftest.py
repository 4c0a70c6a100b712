"""Shared fixtures: real services found by URL, skipped locally when absent, required in CI."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from urllib.parse import urlparse

import pytest
from redis.asyncio import Redis
from support import require_service, test_settings

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
