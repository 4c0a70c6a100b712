"""An insert returns only once its row is flushed, whatever the server's default commit mode.

A database or role whose ``synchronous_commit`` is ``off`` (a common tuning for speed) makes
a commit return before its WAL reaches the disk: a server crash then loses rows the ingress
had already answered 2xx for (reproduced with ``pg_ctl stop -m immediate`` under load: the
last group commit, 50 answered rows, was gone after the restart). The store's own sessions
commit with ``on``. Here the URL's ``options`` stand in for such a database default.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from urllib.parse import quote

import pytest
from logstore.helpers import FakeClock, new_row, postgres_log_store

from pipeline.logstore.postgres import PostgresLogStore


def _with_default(url: str, setting: str) -> str:
    """``url`` whose sessions start with ``synchronous_commit`` at ``setting``."""
    return f"{url}{'&' if '?' in url else '?'}options={quote(f'-c synchronous_commit={setting}')}"


async def _session_settings(store: PostgresLogStore) -> set[str]:
    """``synchronous_commit`` in the store's pooled sessions (each one the pool holds)."""
    seen: set[str] = set()
    async with store._pool.connection() as a, store._pool.connection() as b:
        for conn in (a, b):
            seen.add(str((await (await conn.execute("SHOW synchronous_commit")).fetchall())[0][0]))
    return seen


@pytest.fixture
async def asynchronous_store(postgres_service: str) -> AsyncIterator[PostgresLogStore]:
    """A store on a database whose sessions default to ``synchronous_commit=off``."""
    async with postgres_log_store(
        _with_default(postgres_service, "off"), min_connections=2
    ) as store:
        yield store


async def test_sessions_commit_synchronously_when_the_server_default_is_off(
    asynchronous_store: PostgresLogStore,
) -> None:
    """Every pooled session commits with ``on``, and inserts still work."""
    assert await asynchronous_store.insert(new_row(0, FakeClock())) is True
    assert await _session_settings(asynchronous_store) == {"on"}


@pytest.mark.parametrize("setting", ["local", "remote_apply"])
async def test_a_durable_server_default_is_left_as_it_is(
    postgres_service: str, setting: str
) -> None:
    """A default that flushes locally (``local``, or stronger) is the operator's choice: kept."""
    async with postgres_log_store(
        _with_default(postgres_service, setting), min_connections=2
    ) as store:
        assert await store.insert(new_row(0, FakeClock())) is True
        assert await _session_settings(store) == {setting}
