"""The PostgreSQL registry store behind a transaction-mode PgBouncer, as many operators run it.

PgBouncer hands each transaction to whichever server connection is free: a statement psycopg
prepared on one (after 5 runs on a client connection) was missing on the next ("prepared
statement "_pg3_3" does not exist"), or clashed with another client's of the same name
("already exists"). The registry's advisory locks are transaction-scoped, so they hold.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import urlsplit

import psycopg
import pytest
from pgbouncer_proc import pgbouncer

from pipeline.registry.server.service import Registry
from pipeline.registry.stores.postgres.store import PostgresSchemaStore

SUBJECTS = 3
VERSIONS = 8
"""Registrations per subject: with the lookups, every statement runs past the threshold (5)."""


@pytest.fixture
def through_pgbouncer(postgres_service: str, tmp_path: Path) -> Iterator[str]:
    """A PgBouncer URL whose database is the test's own schema, dropped afterwards.

    PgBouncer passes no ``options`` startup parameter (the store's ``db_schema``): its alias of
    the database sets the ``search_path`` of each server connection instead.
    """
    schema = f"registry_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(postgres_service, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    alias = {"registry": f"connect_query='SET search_path = {schema}'"}
    try:
        with pgbouncer(postgres_service, tmp_path, alias) as url:
            yield urlsplit(url)._replace(path="/registry").geturl()
    finally:
        with psycopg.connect(postgres_service, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE')


def _schema(fields: int) -> str:
    """A record of ``fields`` int fields with defaults: each one a backward-compatible change."""
    defaults = [{"name": f"f{i}", "type": "int", "default": 0} for i in range(fields)]
    return json.dumps({"type": "record", "name": "Event", "fields": defaults})


def test_register_lookup_and_compatibility_again_and_again_behind_pgbouncer(
    through_pgbouncer: str,
) -> None:
    """Subjects evolve side by side, each registration checked, looked up and tested."""
    store = PostgresSchemaStore(through_pgbouncer, pool_max=4)
    registry = Registry(store)
    try:
        with ThreadPoolExecutor(SUBJECTS) as threads:
            versions = list(threads.map(lambda n: _evolve(registry, f"s{n}"), range(SUBJECTS)))
    finally:
        store.close()
    assert versions == [list(range(1, VERSIONS + 1))] * SUBJECTS


def _evolve(registry: Registry, subject: str) -> list[int]:
    """Register ``VERSIONS`` versions, as a producer's serializer and a CI check would."""
    numbers = []
    for fields in range(1, VERSIONS + 1):
        text = _schema(fields)
        assert registry.test(subject, text, None) == []
        registered = registry.register(subject, text)
        assert registry.lookup(subject, text) == registered
        assert registry.store.schema(registered.schema_id) is not None
        numbers.append(registered.version)
    return numbers
