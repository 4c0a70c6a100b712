"""The PostgreSQL registry store outlives its database's connections (a restart, a failover)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import httpx
import psycopg
import pytest

from pipeline.registry.server.api import create_app
from pipeline.registry.server.serve import BackgroundServer
from pipeline.registry.stores.postgres.store import PostgresSchemaStore

POOL_MAX = 4


@pytest.fixture
def named_store(postgres_service: str) -> Iterator[tuple[PostgresSchemaStore, str]]:
    """A store in a uuid-named schema whose connections carry a uuid application name."""
    schema = f"registry_{uuid.uuid4().hex[:12]}"
    name = f"registry_test_{uuid.uuid4().hex[:12]}"
    sep = "&" if "?" in postgres_service else "?"
    store = PostgresSchemaStore(
        f"{postgres_service}{sep}application_name={name}", db_schema=schema, pool_max=POOL_MAX
    )
    try:
        yield store, name
    finally:
        store.close()
        with psycopg.connect(postgres_service, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def test_requests_after_the_database_dropped_the_pooled_connections_succeed(
    named_store: tuple[PostgresSchemaStore, str], postgres_service: str
) -> None:
    """Pooled connections the server closed while idle are replaced, not answered with a 500."""
    store, name = named_store
    text = json.dumps({"type": "record", "name": "Ping", "fields": []})
    with BackgroundServer(create_app(store)) as server, httpx.Client(timeout=30) as client:
        assert client.post(f"{server.url}/subjects/ping-value/versions", json={"schema": text})
        with psycopg.connect(postgres_service, autocommit=True) as admin:
            killed = admin.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE application_name = %s",
                (name,),
            ).fetchone()
        assert killed is not None
        assert killed[0] >= 1
        answers = [
            client.get(f"{server.url}/subjects/ping-value/versions") for _ in range(POOL_MAX)
        ]
        assert [(a.status_code, a.json()) for a in answers] == [(200, [1])] * POOL_MAX
        registered = client.post(
            f"{server.url}/subjects/pong-value/versions", json={"schema": text}
        )
        assert registered.status_code == 200, registered.text
