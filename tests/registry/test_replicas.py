"""Several registry replicas on one PostgreSQL database agree on ids and versions."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from registry.stores import PgFactory

from pipeline.registry.canonical import parse
from pipeline.registry.server.api import create_app
from pipeline.registry.server.serve import BackgroundServer
from pipeline.registry.server.service import Registry

T = TypeVar("T")
ROUNDS = 20


def schema_text(i: int) -> str:
    """A distinct record schema per ``i``, each BACKWARD compatible with the others."""
    field = {"name": f"f{i}", "type": "string", "default": ""}
    return json.dumps({"type": "record", "name": "Evt", "fields": [field]})


def race(*calls: Callable[[], T]) -> list[T]:
    """Run the calls on their own threads, released together by a barrier."""
    barrier = threading.Barrier(len(calls))

    def run(call: Callable[[], T]) -> T:
        barrier.wait(timeout=30)
        return call()

    with ThreadPoolExecutor(len(calls)) as pool:
        return list(pool.map(run, calls))


def test_two_stores_registering_concurrently_get_one_id(pg_stores: PgFactory) -> None:
    """Two store instances registering the same schema at once agree on one id and version."""
    a, b = Registry(pg_stores()), Registry(pg_stores())
    for i in range(ROUNDS):
        text = schema_text(i)
        # A new schema under two subjects at once: both replicas race to insert its row.
        other = race(
            lambda t=text, n=i: a.register(f"x{n}-value", t),
            lambda t=text, n=i: b.register(f"y{n}-value", t),
        )
        assert other[0].schema_id == other[1].schema_id
        same_subject = race(
            lambda t=text: a.register("s-value", t), lambda t=text: b.register("s-value", t)
        )
        assert same_subject[0] == same_subject[1]
        assert same_subject[0].schema_id == other[0].schema_id
    assert [v.version for v in a.store.versions("s-value")] == list(range(1, ROUNDS + 1))
    ids = {a.store.schema(v.schema_id).schema for v in a.store.versions("s-value")}  # type: ignore[union-attr]
    assert len(ids) == ROUNDS


def test_concurrent_appends_to_one_subject_are_serialised(pg_stores: PgFactory) -> None:
    """Different schemas appended at once to one subject get distinct, gap-free versions."""
    stores = [Registry(pg_stores()) for _ in range(4)]
    texts = [schema_text(100 + i) for i in range(4)]
    for reg in stores:
        reg.set_compatibility("many-value", "NONE")
    results = race(
        *[lambda r=r, t=t: r.register("many-value", t) for r, t in zip(stores, texts, strict=True)]
    )
    assert sorted(v.version for v in results) == [1, 2, 3, 4]
    assert len({v.schema_id for v in results}) == 4


def test_two_app_replicas_with_real_clients(pg_stores: PgFactory) -> None:
    """Two servers on one database, driven by two real clients at once, hand out the same ids."""
    with (
        BackgroundServer(create_app(pg_stores())) as one,
        BackgroundServer(create_app(pg_stores())) as two,
    ):
        clients = [SchemaRegistryClient({"url": s.url, "max.retries": 0}) for s in (one, two)]
        try:
            for i in range(ROUNDS):
                schema = Schema(schema_text(i), "AVRO")
                got = race(
                    lambda s=schema: clients[0].register_schema("r-value", s),
                    lambda s=schema: clients[1].register_schema("r-value", s),
                )
                assert got[0] == got[1]
                fetched = clients[1].get_schema(got[0])
                assert parse(fetched.schema_str).fingerprint == parse(schema.schema_str).fingerprint
            assert clients[0].get_versions("r-value") == list(range(1, ROUNDS + 1))
        finally:
            for client in clients:
                client.close()
