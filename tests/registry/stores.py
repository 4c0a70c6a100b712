"""The registry's stores as fixtures, shared by the registry, contract and hostile-input suites.

SQLite lives in tmp_path, PostgreSQL in a uuid-named schema per test, dropped afterwards.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest

from pipeline.registry.stores.postgres.store import PostgresSchemaStore
from pipeline.registry.stores.protocol import RegistryStore
from pipeline.registry.stores.sqlite.store import SqliteSchemaStore

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


def open_test_store(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[RegistryStore]:
    """An empty registry store of ``kind`` (``sqlite`` or ``postgres``), closed afterwards."""
    if kind == "sqlite":
        sqlite = SqliteSchemaStore(str(tmp_path / "registry.db"))
        yield sqlite
        sqlite.close()
        return
    yield request.getfixturevalue("pg_stores")()


@pytest.fixture(params=["sqlite", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[RegistryStore]:
    """Each registry store in turn, empty."""
    yield from open_test_store(request.param, request, tmp_path)
