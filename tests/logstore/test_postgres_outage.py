"""With PostgreSQL unreachable or not answering, operations fail within seconds; the store recovers.

The outage is a TCP relay in front of the real server that the test cuts (listener and every
relayed connection closed) and brings back on the same port, or stalls (every connection kept
open, no byte forwarded either way: a hung server, or a dead network path) and resumes; the
server itself keeps running. The bounds below are generous (15 s, 30 s with a stalled server):
the store fails in about its connection and answer timeouts (3 s each by default, ``TIMEOUT_S``
here, so that each wait the tests prove costs a second), where a pool waiting its default 30 s
per request, or a statement waiting for an answer without end, would not.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import psycopg
import pytest
from logstore.helpers import FakeClock, new_row
from logstore.relay import Relay, relay_to

from pipeline.logstore import LogStoreError, RowState, Selection
from pipeline.logstore.postgres import PostgresLogStore

TIMEOUT_S = 1.0  # the store's connection and answer timeout (connect_timeout_s), 3 s by default
BOUND_S = 15.0  # far above the store's few seconds, far below a 30 s pool wait
STALLED_BOUND_S = 30.0  # far above the store's few seconds; without an answer timeout: forever


@pytest.fixture
async def relay(postgres_service: str) -> AsyncIterator[Relay]:
    """A started relay to the test PostgreSQL, cut afterwards."""
    async with relay_to(postgres_service) as started:
        yield started


@pytest.fixture
def schema() -> str:
    """The schema of the test's store."""
    return f"t_{uuid.uuid4().hex[:12]}"


@pytest.fixture
async def store(
    postgres_service: str, relay: Relay, schema: str
) -> AsyncIterator[PostgresLogStore]:
    """An open store of its own schema, connected through ``relay``; dropped afterwards."""
    url = urlsplit(postgres_service)
    through = url._replace(netloc=f"{url.username}:{url.password}@127.0.0.1:{relay.port}")
    s = PostgresLogStore(through.geturl(), schema=schema, connect_timeout_s=TIMEOUT_S)
    await s.open()
    try:
        yield s
    finally:
        relay.resume()  # a statement still waiting for its answer gets it, and close() ends
        if not relay.serving:
            await relay.start()
        await s.close()
        async with await psycopg.AsyncConnection.connect(postgres_service, autocommit=True) as c:
            await c.execute(f'DROP SCHEMA "{schema}" CASCADE')


async def test_inserts_fail_promptly_while_postgres_is_unreachable(
    store: PostgresLogStore, relay: Relay
) -> None:
    """Each insert with the server unreachable raises LogStoreError in seconds, not a 30 s wait."""
    clock = FakeClock()
    assert await store.insert(new_row(0, clock)) is True
    await relay.cut()
    for n in range(1, 4):  # the broken pooled connection, then the pool's wait for a new one
        with pytest.raises(LogStoreError):
            await asyncio.wait_for(store.insert(new_row(n, clock)), BOUND_S)
    concurrent = [store.insert(new_row(n, clock)) for n in range(4, 8)]
    results = await asyncio.wait_for(asyncio.gather(*concurrent, return_exceptions=True), BOUND_S)
    assert all(isinstance(result, LogStoreError) for result in results), results


async def test_connections_the_server_dropped_while_idle_are_not_used(
    store: PostgresLogStore, relay: Relay
) -> None:
    """After the server closed the pooled connections (a restart), the next insert succeeds."""
    clock = FakeClock()
    assert await store.insert(new_row(0, clock)) is True
    await relay.drop()
    assert await asyncio.wait_for(store.insert(new_row(1, clock)), BOUND_S) is True
    assert (await store.get(new_row(1, clock).id)) is not None


async def test_the_store_recovers_when_postgres_is_reachable_again(
    store: PostgresLogStore, relay: Relay
) -> None:
    """After an outage, inserts succeed again within seconds of the server coming back."""
    clock = FakeClock()
    assert await store.insert(new_row(0, clock)) is True
    await relay.cut()
    for n in range(1, 3):
        with pytest.raises(LogStoreError):
            await asyncio.wait_for(store.insert(new_row(n, clock)), BOUND_S)
    await relay.start()

    async def first_success() -> int:
        for n in range(10, 100):  # each failure is a wait of the store's timeout, not a spin
            try:
                assert await store.insert(new_row(n, clock)) is True
            except LogStoreError:
                continue
            return n
        raise AssertionError("no insert succeeded")

    n = await asyncio.wait_for(first_success(), BOUND_S)
    assert (await store.get(new_row(n, clock).id)) is not None


async def test_inserts_fail_promptly_while_postgres_does_not_answer(
    store: PostgresLogStore, relay: Relay
) -> None:
    """With the server's connections open but silent, inserts raise LogStoreError in seconds."""
    clock = FakeClock()
    assert await store.insert(new_row(0, clock)) is True
    relay.stall()
    with pytest.raises(LogStoreError):
        await asyncio.wait_for(store.insert(new_row(1, clock)), STALLED_BOUND_S)
    concurrent = [store.insert(new_row(n, clock)) for n in range(2, 8)]
    results = await asyncio.wait_for(
        asyncio.gather(*concurrent, return_exceptions=True), STALLED_BOUND_S
    )
    assert all(isinstance(result, LogStoreError) for result in results), results


async def test_sweeper_and_dispatcher_operations_fail_promptly_while_postgres_does_not_answer(
    store: PostgresLogStore, relay: Relay
) -> None:
    """With the server silent, claims, produce bookkeeping and lookups raise LogStoreError."""
    clock = FakeClock()
    row = new_row(0, clock)
    assert await store.insert(row) is True
    relay.stall()
    operations = [
        store.claim_unproduced(clock.now_ms + 1, 10, 30_000),
        store.claim_unprocessed(clock.now_ms + 1, 10, 30_000),
        store.mark_produced([row.id]),
        store.record_failure([row.id], "broker down"),
        store.mark_processed([row.id]),
        store.get(row.id),
    ]
    results = await asyncio.wait_for(
        asyncio.gather(*operations, return_exceptions=True), STALLED_BOUND_S
    )
    assert all(isinstance(result, LogStoreError) for result in results), results


async def test_the_store_recovers_when_postgres_answers_again(
    store: PostgresLogStore, relay: Relay
) -> None:
    """Connections left without an answer are discarded: once the server answers, all work again."""
    clock = FakeClock()
    assert await store.insert(new_row(0, clock)) is True
    relay.stall()
    unknown = new_row(1, clock)
    with pytest.raises(LogStoreError):
        await asyncio.wait_for(store.insert(unknown), STALLED_BOUND_S)
    relay.resume()

    async def first_success() -> int:
        for n in range(10, 100):  # each failure is a wait of the store's timeout, not a spin
            try:
                assert await store.insert(new_row(n, clock)) is True
            except LogStoreError:
                continue
            return n
        raise AssertionError("no insert succeeded")

    n = await asyncio.wait_for(first_success(), STALLED_BOUND_S)
    # Every pooled connection answers (none was put back with a statement still pending), and
    # the insert whose outcome was unknown is stored once, whether or not it had landed.
    found = await asyncio.wait_for(
        asyncio.gather(*(store.get(new_row(m, clock).id) for m in (0, n, n, n, n, n))),
        STALLED_BOUND_S,
    )
    assert all(row is not None for row in found)
    assert await store.insert(unknown) in (True, False)
    assert (await store.get(unknown.id)) is not None


@contextlib.asynccontextmanager
async def table_locked(
    postgres_service: str, schema: str
) -> AsyncIterator[psycopg.AsyncConnection]:
    """The test's table locked (ACCESS EXCLUSIVE) by a connection of its own, released on exit."""
    locker = await psycopg.AsyncConnection.connect(postgres_service)
    try:
        await locker.execute(f'LOCK TABLE "{schema}".ingress_log IN ACCESS EXCLUSIVE MODE')
        yield locker
    finally:
        await locker.rollback()
        await locker.close()


async def _blocked_on_lock(postgres_service: str, schema: str, count: int) -> None:
    """Return once ``count`` statements wait for a lock on the test's table, on the server."""
    waiting = "SELECT count(*) FROM pg_locks WHERE NOT granted AND relation = %s::regclass"
    table = f'"{schema}".ingress_log'
    async with await psycopg.AsyncConnection.connect(postgres_service) as probe:
        while (await (await probe.execute(waiting, [table])).fetchall())[0][0] < count:  # noqa: ASYNC110 - polls the server's locks; no event signals it
            await asyncio.sleep(0.05)


async def test_a_group_commit_left_unanswered_fails_in_time_and_is_stored_once(
    store: PostgresLogStore, postgres_service: str, schema: str
) -> None:
    """A group commit the server holds (table locked) fails in seconds, and those queued behind."""
    clock = FakeClock()
    assert await store.insert(new_row(0, clock)) is True
    async with table_locked(postgres_service, schema):
        first = asyncio.ensure_future(store.insert(new_row(1, clock)))
        await asyncio.wait_for(_blocked_on_lock(postgres_service, schema, 1), STALLED_BOUND_S)
        queued = [store.insert(new_row(n, clock)) for n in range(2, 6)]  # behind the first
        results = await asyncio.wait_for(
            asyncio.gather(first, *queued, return_exceptions=True), STALLED_BOUND_S
        )
        assert all(isinstance(result, LogStoreError) for result in results), results
        assert "did not answer" in str(results[0])
    # Each outcome was unknown: a row that landed after all is a duplicate when sent again.
    for n in range(1, 6):
        assert await store.insert(new_row(n, clock)) in (True, False)
    counts = await store.count_by_state(Selection())
    assert sum(counts.values()) == 6


async def test_replay_status_and_purge_reads_fail_in_time_when_postgres_stops_answering(
    store: PostgresLogStore, relay: Relay, postgres_service: str, schema: str
) -> None:
    """Status and replay reads, and purge, under way when the server falls silent, fail in time."""
    clock = FakeClock()
    assert await store.insert(new_row(0, clock)) is True
    async with table_locked(postgres_service, schema):
        operations = [
            asyncio.ensure_future(store.count_by_state(Selection())),
            asyncio.ensure_future(store.last_id(Selection())),
            asyncio.ensure_future(store.select(Selection(), limit=10)),
            asyncio.ensure_future(store.purge(clock.now_ms + 1)),
        ]
        await asyncio.wait_for(_blocked_on_lock(postgres_service, schema, 4), STALLED_BOUND_S)
        relay.stall()  # each statement is on the server: its answer never comes back
    results = await asyncio.wait_for(
        asyncio.gather(*operations, return_exceptions=True), STALLED_BOUND_S
    )
    assert all(isinstance(result, LogStoreError) for result in results), results
    assert all("did not answer" in str(result) for result in results), results


async def test_a_bulk_read_the_server_works_on_past_the_answer_timeout_is_not_cut(
    store: PostgresLogStore, postgres_service: str, schema: str
) -> None:
    """A count held by a lock for twice the answer timeout, the server answering, completes."""
    clock = FakeClock()
    assert await store.insert(new_row(0, clock)) is True
    async with table_locked(postgres_service, schema) as locker:
        counting = asyncio.ensure_future(store.count_by_state(Selection()))
        await asyncio.wait_for(_blocked_on_lock(postgres_service, schema, 1), STALLED_BOUND_S)
        # The lock is held on the server for twice the store's answer timeout, and then some.
        await locker.execute("SELECT pg_sleep(%s)", [2 * TIMEOUT_S + 0.5])
        assert not counting.done()
    counts = await asyncio.wait_for(counting, STALLED_BOUND_S)
    assert counts == {RowState.RECEIVED: 1}
