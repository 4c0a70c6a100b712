"""Registry fixtures: both stores, and a real uvicorn server on an ephemeral port.

SQLite lives in tmp_path, PostgreSQL in a uuid-named schema per test; clients are
confluent-kafka's own.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient

from pipeline.registry.api import create_app
from pipeline.registry.postgres_store import PostgresSchemaStore
from pipeline.registry.server import BackgroundServer
from pipeline.registry.sqlite_store import SqliteSchemaStore
from pipeline.registry.store import RegistryStore

PgFactory = Callable[[], PostgresSchemaStore]


@pytest.fixture
def pg_stores(postgres_service: str) -> Iterator[PgFactory]:
    """Opens PostgreSQL stores that share one uuid-named schema, dropped afterwards."""
    schema = f"registry_{uuid.uuid4().hex[:12]}"
    opened: list[PostgresSchemaStore] = []

    def make() -> PostgresSchemaStore:
        store = PostgresSchemaStore(postgres_service, db_schema=schema, pool_max=8)
        opened.append(store)
        return store

    yield make
    for store in opened:
        store.close()
    with psycopg.connect(postgres_service, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


@pytest.fixture(params=["sqlite", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[RegistryStore]:
    """Each registry store in turn, empty."""
    if request.param == "sqlite":
        sqlite = SqliteSchemaStore(str(tmp_path / "registry.db"))
        yield sqlite
        sqlite.close()
        return
    yield request.getfixturevalue("pg_stores")()


@pytest.fixture
def registry_url(store: RegistryStore) -> Iterator[str]:
    """A registry served by uvicorn on 127.0.0.1 and a free port, over ``store``."""
    with BackgroundServer(create_app(store)) as server:
        yield server.url


@pytest.fixture
def sqlite_registry_url(tmp_path: Path) -> Iterator[str]:
    """A registry on an SQLite store only, for tests about clients rather than stores."""
    store = SqliteSchemaStore(str(tmp_path / "registry.db"))
    with BackgroundServer(create_app(store)) as server:
        yield server.url
    store.close()


@pytest.fixture
def sr_client(registry_url: str) -> Iterator[SchemaRegistryClient]:
    """confluent-kafka's SchemaRegistryClient pointed at our server (no retry sleeps)."""
    client = SchemaRegistryClient({"url": registry_url, "max.retries": 0})
    yield client
    client.close()
