"""``pipeline ingress serve`` whose SQLite log sits on a volume with a little room left.

A small row still commits there while a webhook of ordinary size does not: readiness must not
come back on the small write alone (a load balancer would send traffic, the next webhook fail,
readiness go again, every second). The volume is a real one: a 2 MiB tmpfs, mounted for the
test (root with CAP_SYS_ADMIN only).
"""

from __future__ import annotations

import asyncio
import errno
import os
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path

import psycopg
import pytest
from ingress.helpers import serving, terminated, volume_ingress_env

from pipeline.config import Settings
from pipeline.ingress.service import WRITE_PROBE_S
from pipeline.logstore import LogStore, LogStoreError, NewRow, Selection
from pipeline.logstore.postgres import PostgresLogStore
from pipeline.logstore.sqlite import SqliteLogStore

SECRET = "nearly-full-secret"  # noqa: S105 - a test secret
BODY = 64 * 1024
"""A webhook of ordinary size, which the nearly full volume cannot take."""
LEFT = 48 * 1024
"""What the volume is filled down to: room for a small row, not for :data:`BODY`."""
WATCH_S = 5 * WRITE_PROBE_S
"""How long readiness is watched on the nearly full volume: five write probes."""


def free_bytes(path: Path) -> int:
    """The bytes left on ``path``'s volume."""
    stats = os.statvfs(path)
    return stats.f_bavail * stats.f_frsize


def fill_down_to(path: Path, left: int) -> None:
    """Write ``path`` until its volume has at most ``left`` bytes left (or none)."""
    with path.open("ab", buffering=0) as filler:
        while free_bytes(path) > left:
            try:
                filler.write(b"\0" * 4096)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                return


def row(event_id: str, size: int) -> NewRow:
    """A log row of ``event_id`` whose body is ``size`` bytes."""
    return NewRow(
        id=event_id,
        source="whatsapp",
        tenant="",
        key="",
        topic="messages",
        lane="messages",
        event_id=event_id,
        received_at_ms=0,
        headers={},
        body=os.urandom(size),
    )


async def test_a_probe_of_a_body_size_fails_where_that_body_would(volume: Path) -> None:
    """On a nearly full volume a small probe commits, one of ``BODY`` bytes fails as its row does.

    Nothing of either probe is left in the log.
    """
    store = SqliteLogStore(volume / "ingress.db")
    await store.open()
    try:
        assert await store.insert(row("before", 2000))
        fill_down_to(volume / "filler", LEFT)
        with pytest.raises(LogStoreError):
            await store.insert(row("large", BODY))
        await store.probe_write()  # a small row still commits: this alone says nothing
        with pytest.raises(LogStoreError):
            await store.probe_write(BODY)
        (volume / "filler").unlink()
        await store.probe_write(BODY)
        assert await store.insert(row("large", BODY))
        assert {r.id for r in await store.select(Selection(), limit=10)} == {"before", "large"}
    finally:
        await store.close()


async def wal_lsn(url: str) -> int:
    """Where the PostgreSQL server's WAL has been written to, in bytes."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cur = await conn.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn")
        found = await cur.fetchone()
        assert found is not None
        return int(found[0])


async def test_a_probe_writes_its_body_and_keeps_nothing(
    store: LogStore, settings: Settings
) -> None:
    """Each store's probe of ``BODY`` bytes writes them (on PostgreSQL: its WAL grows as much)."""
    postgres = isinstance(store, PostgresLogStore)
    before = await wal_lsn(settings.postgres.url) if postgres else 0
    await store.probe_write(BODY)
    if postgres:  # others may write too: at least the probe's body, never less
        assert await wal_lsn(settings.postgres.url) - before >= BODY
    assert await store.select(Selection(), limit=10) == []


@pytest.fixture
async def env(
    tmp_path: Path, volume: Path, redis_service: str, unique: str
) -> AsyncIterator[dict[str, str]]:
    """An ingress on Redis Streams with its log on ``volume``: a topic of its own, made here."""
    async with volume_ingress_env(tmp_path, volume, redis_service, unique, SECRET) as variables:
        yield variables


async def test_readiness_stays_down_while_a_webhook_of_ordinary_size_cannot_be_stored(
    env: dict[str, str], volume: Path, started: list[subprocess.Popen[str]]
) -> None:
    """Nearly full: /readyz stays 503 (no flapping); freed: ready, and the webhook is stored."""
    async with serving(env, started, SECRET, size=BODY) as (proc, hooks):
        await hooks.send_accepted(3)
        fill_down_to(volume / "filler", LEFT)
        assert (await hooks.send()).status_code == 503
        # Watched as a load balancer would: each time it is ready, a webhook is sent to it.
        ready_at: list[float] = []
        refused = 0
        start = time.monotonic()
        while (now := time.monotonic() - start) < WATCH_S:
            if await hooks.ready() == 200:
                ready_at.append(round(now, 2))
                refused += (await hooks.send()).status_code == 503
            else:
                await asyncio.sleep(0.05)
        assert not ready_at, f"ready at {ready_at} s, then {refused} webhooks refused"
        (volume / "filler").unlink()
        await hooks.until_ready()
        assert (await hooks.send()).status_code == 200
        assert await hooks.ready() == 200
    await terminated(proc)
