"""Registry fixtures: both stores, and a real uvicorn server on an ephemeral port.

SQLite lives in tmp_path, PostgreSQL in a uuid-named schema per test; clients are
confluent-kafka's own.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from registry.stores import pg_stores, store  # noqa: F401 - fixtures for this suite

from pipeline.registry.client.http import RegistryClient
from pipeline.registry.server.api import create_app
from pipeline.registry.server.serve import BackgroundServer
from pipeline.registry.stores.protocol import RegistryStore
from pipeline.registry.stores.sqlite.store import SqliteSchemaStore


@pytest.fixture
def registry_url(store: RegistryStore) -> Iterator[str]:  # noqa: F811 - the imported fixture
    """A registry served by uvicorn on 127.0.0.1 and a free port, over ``store``."""
    with BackgroundServer(create_app(store)) as server:
        yield server.url


@pytest.fixture
def sqlite_registry_url(tmp_path: Path) -> Iterator[str]:
    """A registry on an SQLite store only, for tests about clients rather than stores."""
    sqlite = SqliteSchemaStore(str(tmp_path / "registry.db"))
    with BackgroundServer(create_app(sqlite)) as server:
        yield server.url
    sqlite.close()


@pytest.fixture
def sr_client(registry_url: str) -> Iterator[SchemaRegistryClient]:
    """confluent-kafka's SchemaRegistryClient pointed at our server (no retry sleeps)."""
    client = SchemaRegistryClient({"url": registry_url, "max.retries": 0})
    yield client
    client.close()


@pytest.fixture
def ours(sqlite_registry_url: str) -> Iterator[RegistryClient]:
    """Our registry client on a real registry server (SQLite store)."""
    client = RegistryClient(sqlite_registry_url)
    yield client
    client.close()
