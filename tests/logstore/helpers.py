"""Helpers shared by the log store and ingress tests."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import psycopg

from pipeline.logstore import LogStore, NewRow
from pipeline.logstore.postgres import PostgresLogStore
from pipeline.logstore.sqlite import SqliteLogStore


class FakeClock:
    """Seconds since the epoch that move only when a test says so."""

    def __init__(self, start_s: float = 1_800_000_000.0) -> None:
        """Start at ``start_s``."""
        self.now_s = start_s

    def __call__(self) -> float:
        """The current time in seconds."""
        return self.now_s

    def advance(self, seconds: float) -> None:
        """Move the clock forward."""
        self.now_s += seconds

    @property
    def now_ms(self) -> int:
        """The current time in milliseconds."""
        return int(self.now_s * 1000)


def new_row(n: int, clock: FakeClock, **fields: object) -> NewRow:
    """A row numbered ``n`` received now; ``fields`` override any attribute."""
    values: dict[str, object] = {
        "id": f"{clock.now_ms:013x}{n:08x}",
        "source": "meta",
        "tenant": "t1",
        "key": f"k{n % 3}",
        "topic": "messages",
        "lane": "messages",
        "event_id": f"ev-{n}",
        "received_at_ms": clock.now_ms,
        "headers": {"x-hub-signature-256": "sha256=00"},
        "body": b'{"n": %d}' % n,
    }
    values.update(fields)
    return NewRow(**values)  # type: ignore[arg-type]


@asynccontextmanager
async def real_log_store(
    kind: str, tmp_path: Path, postgres_url: str, clock: Callable[[], float] | None = None
) -> AsyncIterator[LogStore]:
    """An open, empty log store of ``kind`` (sqlite or postgres), closed afterwards.

    PostgreSQL gets a schema of its own, dropped afterwards; the caller makes sure the server
    runs (the ``postgres_service`` fixture).
    """
    extra = {} if clock is None else {"clock": clock}
    if kind == "sqlite":
        sqlite = SqliteLogStore(tmp_path / "log.db", **extra)
        await sqlite.open()
        try:
            yield sqlite
        finally:
            await sqlite.close()
        return
    async with postgres_log_store(postgres_url, **extra) as pg:
        yield pg


@asynccontextmanager
async def postgres_log_store(url: str, **options: Any) -> AsyncIterator[PostgresLogStore]:
    """An open PostgreSQL log store at ``url`` in a schema of its own, dropped afterwards.

    ``options`` are the store's other arguments (``clock``, ``min_connections``, ...).
    """
    schema = f"t_{uuid.uuid4().hex[:12]}"
    store = PostgresLogStore(url, schema=schema, **options)
    await store.open()
    try:
        yield store
    finally:
        await store.close()
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as c:
            await c.execute(f'DROP SCHEMA "{schema}" CASCADE')
