"""Schema ids on PostgreSQL when IMPORT registrations (explicit ids) run beside generated ones.

A registration that inserts a new schema is paused right after its insert (a hook on the real
store's statement), and the competing registration runs exactly then, from another store on the
same database (another replica): the interleavings concurrent requests hit only now and then
happen every time. A competitor runs on its own thread; the paused one goes on once the
competitor has finished or waits for a lock (PostgreSQL says which, in ``pg_stat_activity``).
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from pipeline.registry.canonical import parse
from pipeline.registry.errors import IdConflict, RegistryError, SchemaIdTaken
from pipeline.registry.server.api import create_app
from pipeline.registry.server.serve import BackgroundServer
from pipeline.registry.server.service import Registry
from pipeline.registry.stores.postgres import store as pg
from pipeline.registry.stores.postgres.store import PostgresSchemaStore
from pipeline.registry.stores.protocol import RegistryStore, SubjectVersion
from pipeline.registry.stores.sqlite.store import SqliteSchemaStore

Replica = Callable[[str], Registry]
_WAITING = (
    "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s AND wait_event_type = 'Lock'"
)


def schema_text(i: int) -> str:
    """A distinct record schema per ``i``."""
    field = {"name": f"f{i}", "type": "string", "default": ""}
    return json.dumps({"type": "record", "name": "Evt", "fields": [field]})


@pytest.fixture
def replicas(postgres_service: str) -> Iterator[tuple[Replica, Callable[[str], bool]]]:
    """Opens registries named by their connections' application_name, on one uuid-named schema.

    Also yields ``waiting(name)``: whether that registry's connection waits for a lock.
    """
    schema = f"registry_{uuid.uuid4().hex[:12]}"
    prefix = f"imp-{uuid.uuid4().hex[:8]}"
    opened: list[PostgresSchemaStore] = []
    sep = "&" if "?" in postgres_service else "?"

    def make(name: str) -> Registry:
        url = f"{postgres_service}{sep}application_name={prefix}-{name}"
        store = PostgresSchemaStore(url, db_schema=schema, pool_max=2)
        opened.append(store)
        return Registry(store)

    with psycopg.connect(postgres_service, autocommit=True) as watch:

        def waiting(name: str) -> bool:
            row = watch.execute(_WAITING, (f"{prefix}-{name}",)).fetchone()
            return bool(row and row[0])

        yield make, waiting
    for store in opened:
        store.close()
    with psycopg.connect(postgres_service, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


class _Hooked:
    """A connection that runs ``then`` once, right after the statement ``sql`` executed."""

    def __init__(self, conn: psycopg.Connection[Any], sql: str, then: list[Callable[[], None]]):
        self._conn, self._sql, self._then = conn, sql, then

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)

    def execute(self, sql: str, params: Any = None) -> Any:
        cur = self._conn.execute(sql, params)
        if sql == self._sql and self._then:
            self._then.pop()()
        return cur


def pause_after(registry: Registry, sql: str, then: Callable[[], None]) -> None:
    """Run ``then`` inside ``registry``'s next transaction, right after it executes ``sql``."""
    store = registry.store
    assert isinstance(store, PostgresSchemaStore)
    real_tx = store._tx
    pending = [then]

    @contextmanager
    def tx(*, write: bool = False) -> Iterator[Any]:
        with real_tx(write=write) as conn:
            yield _Hooked(conn, sql, pending)

    store._tx = tx  # type: ignore[method-assign]


def start(
    pool: ThreadPoolExecutor, waiting: Callable[[str], bool], name: str, call: Callable[[], Any]
) -> Future[Any]:
    """Submit ``call`` (made by replica ``name``); return once it finished or waits on a lock."""
    future = pool.submit(call)
    for _ in range(6000):  # 30 s at most
        if wait([future], timeout=0.005).done or waiting(name):
            return future
    raise AssertionError(f"replica {name} neither finished nor waited for a lock")


def importer(make: Replica, name: str, subject: str) -> Registry:
    """A replica with ``subject`` in IMPORT mode."""
    registry = make(name)
    registry.set_mode(subject, "IMPORT")
    return registry


def assert_resolves(registry: Registry, got: SubjectVersion, text: str) -> None:
    """``got``'s id holds exactly ``text``."""
    stored = registry.store.schema(got.schema_id)
    assert stored is not None, got
    assert parse(stored.schema).fingerprint == parse(text).fingerprint, (got, stored)


def test_an_import_below_a_pending_generated_id_never_hands_that_id_out_again(
    replicas: tuple[Replica, Callable[[str], bool]],
) -> None:
    """Importing a free id below an uncommitted generated id never gets that id handed out twice."""
    make, waiting = replicas
    imp = importer(make, "imp", "imp-value")
    imp.register("imp-value", schema_text(1), schema_id=1)
    imp.register("imp-value", schema_text(10), schema_id=10)
    live, other = make("live"), make("other")
    futures: list[Future[SubjectVersion]] = []
    with ThreadPoolExecutor(2) as pool:

        def compete() -> None:
            futures.append(
                start(
                    pool,
                    waiting,
                    "imp",
                    lambda: imp.register("imp-value", schema_text(7), schema_id=7),
                )
            )
            futures.append(
                start(
                    pool, waiting, "other", lambda: other.register("other-value", schema_text(30))
                )
            )

        pause_after(live, pg._INSERT_SCHEMA, compete)
        paused = live.register("live-value", schema_text(20))
        imported, generated = (f.result() for f in futures)
    assert_resolves(live, paused, schema_text(20))
    assert_resolves(live, imported, schema_text(7))
    assert_resolves(live, generated, schema_text(30))
    assert imported.schema_id == 7
    assert len({paused.schema_id, imported.schema_id, generated.schema_id, 1, 10}) == 5


@pytest.mark.parametrize(
    ("text", "wanted", "refusal"),
    [(schema_text(99), 3, SchemaIdTaken), (schema_text(20), 9, IdConflict)],
    ids=["another-schema-same-id", "same-schema-another-id"],
)
def test_an_import_clashing_with_a_pending_new_schema_is_refused_as_a_conflict(
    replicas: tuple[Replica, Callable[[str], bool]],
    text: str,
    wanted: int,
    refusal: type[RegistryError],
) -> None:
    """An import of the id (or schema) a pending registration is inserting is refused, no 500."""
    make, waiting = replicas
    live = make("live")
    live.register("base-value", schema_text(1))
    live.register("base-value", schema_text(2))
    imp = importer(make, "imp", "imp-value")
    futures: list[Future[SubjectVersion]] = []
    with ThreadPoolExecutor(1) as pool:

        def compete() -> None:
            futures.append(
                start(
                    pool, waiting, "imp", lambda: imp.register("imp-value", text, schema_id=wanted)
                )
            )

        pause_after(live, pg._INSERT_SCHEMA, compete)
        paused = live.register("live-value", schema_text(20))
        with pytest.raises(refusal):
            futures[0].result()
    assert paused.schema_id == 3
    assert_resolves(live, paused, schema_text(20))
    assert live.store.usages(3) == [paused]


def test_a_generated_id_never_lands_on_a_pending_import(
    replicas: tuple[Replica, Callable[[str], bool]],
) -> None:
    """A new schema registered while an import of the next id is uncommitted gets another id."""
    make, waiting = replicas
    live = make("live")
    live.register("base-value", schema_text(1))
    imp = importer(make, "imp", "imp-value")
    futures: list[Future[SubjectVersion]] = []
    with ThreadPoolExecutor(1) as pool:

        def compete() -> None:
            futures.append(
                start(pool, waiting, "live", lambda: live.register("live-value", schema_text(30)))
            )

        pause_after(imp, pg._INSERT_SCHEMA_WITH_ID, compete)
        imported = imp.register("imp-value", schema_text(2), schema_id=2)
        generated = futures[0].result()
    assert imported.schema_id == 2
    assert generated.schema_id not in {1, 2}
    assert_resolves(live, imported, schema_text(2))
    assert_resolves(live, generated, schema_text(30))


async def race_over_http(one_store: RegistryStore, two_store: RegistryStore) -> None:
    """Rounds of an import below the generated ids beside new registrations, on two servers.

    Every registration answers 200 with an id that resolves to exactly its schema, and no id is
    handed out twice.
    """
    rounds = 30
    setup = Registry(one_store)
    setup.set_mode("imp-value", "IMPORT")
    setup.register("imp-value", schema_text(0), schema_id=1000)  # generated ids continue above
    with (
        BackgroundServer(create_app(one_store)) as one,
        BackgroundServer(create_app(two_store)) as two,
    ):
        registered: list[tuple[int, str]] = []
        async with httpx.AsyncClient(timeout=30) as client:

            async def post(url: str, subject: str, body: dict[str, Any]) -> None:
                answer = await client.post(f"{url}/subjects/{subject}/versions", json=body)
                assert answer.status_code == 200, answer.text
                registered.append((answer.json()["id"], body["schema"]))

            for i in range(1, rounds + 1):
                await asyncio.gather(
                    post(one.url, "imp-value", {"schema": schema_text(i), "id": i}),
                    post(two.url, f"a{i}-value", {"schema": schema_text(1000 + i)}),
                    post(one.url, f"b{i}-value", {"schema": schema_text(2000 + i)}),
                    post(two.url, f"c{i}-value", {"schema": schema_text(3000 + i)}),
                )
            for schema_id, text in registered:
                got = await client.get(f"{two.url}/schemas/ids/{schema_id}")
                assert got.status_code == 200, got.text
                assert parse(got.json()["schema"]).fingerprint == parse(text).fingerprint
    assert len({schema_id for schema_id, _ in registered}) == len(registered)


async def test_concurrent_imports_and_registrations_over_http_keep_every_id_on_postgres(
    replicas: tuple[Replica, Callable[[str], bool]],
) -> None:
    """Two PostgreSQL replicas importing and registering at once: no 500, no id reused."""
    make, _ = replicas
    await race_over_http(make("one").store, make("two").store)


async def test_concurrent_imports_and_registrations_over_http_keep_every_id_on_sqlite(
    tmp_path: Path,
) -> None:
    """Two servers on one SQLite file importing and registering at once: no 500, no id reused."""
    stores = [SqliteSchemaStore(str(tmp_path / "registry.db")) for _ in range(2)]
    try:
        await race_over_http(*stores)
    finally:
        for store in stores:
            store.close()
