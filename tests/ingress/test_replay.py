"""Replay by hand: filters, dry run, rate cap, counters, and the CLI commands around it."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from contract.helpers import consume_until, make_topic
from logstore.helpers import FakeClock, new_row
from support import stopped_once_it_sent
from typer.testing import CliRunner

from pipeline.config import Settings
from pipeline.ingress import headers as h
from pipeline.ingress.cli import ops_app
from pipeline.ingress.replay import replay
from pipeline.logstore import LogRow, RowState, Selection
from pipeline.logstore.sqlite import SqliteLogStore
from pipeline.transport import create_transport
from pipeline.transport.protocol import Transport


@pytest.fixture
async def redis(settings: Settings, redis_service: str) -> AsyncIterator[Transport]:
    """The real Redis Streams transport."""
    transport = create_transport(settings, "redis")
    yield transport
    await transport.close()


async def seed(store: SqliteLogStore, clock: FakeClock, topic: str) -> list[LogRow]:
    """Twelve rows over two sources, three tenants, twelve seconds and three states."""
    for n in range(12):
        await store.insert(
            new_row(n, clock, topic=topic, source="a" if n % 2 else "b", tenant=f"t{n % 3}")
        )
        clock.advance(1)
    rows = await store.select(Selection(), limit=100)
    await store.mark_produced([r.id for r in rows[:6]])
    await store.mark_processed([r.id for r in rows[:2]])
    return rows


@pytest.mark.parametrize(
    ("selection", "expected"),
    [
        (Selection(source="a"), [1, 3, 5, 7, 9, 11]),
        (Selection(source="a", tenant="t0"), [3, 9]),
        (Selection(since_ms=1_800_000_004_000, until_ms=1_800_000_007_000), [4, 5, 6]),
        (Selection(states=(RowState.RECEIVED,)), [6, 7, 8, 9, 10, 11]),
        (Selection(states=(RowState.PROCESSED, RowState.PRODUCED), tenant="t1"), [1, 4]),
    ],
    ids=["source", "source+tenant", "time-window", "state", "states+tenant"],
)
async def test_replay_produces_exactly_the_selection(
    tmp_path: Path, redis: Transport, unique: str, selection: Selection, expected: list[int]
) -> None:
    """Only rows matching every filter are produced again, with replay-count 1."""
    clock = FakeClock()
    store = SqliteLogStore(tmp_path / "log.db", clock=clock)
    await store.open()
    topic = f"t-{unique}"
    await make_topic(redis, topic, 2)
    await seed(store, clock, topic)
    summary = await replay(store, redis.producer(), selection)
    assert summary.replayed == len(expected)
    assert summary.by_topic == {topic: len(expected)}
    consumer = redis.consumer(f"g-{unique}", [topic])
    got = await consume_until(consumer, lambda r: len(r) >= len(expected))
    await consumer.close()
    assert sorted(m.headers[h.EVENT_ID].decode() for m in got) == sorted(
        f"ev-{n}" for n in expected
    )
    assert {m.headers[h.REPLAY_COUNT] for m in got} == {b"1"}
    for message in got:
        row = await store.get(message.headers[h.ROW_ID].decode())
        assert row is not None
        assert row.replay_count == 0  # a replay by hand gives the sweeper its whole budget again
    await store.close()


async def test_replay_by_id_and_dry_run(tmp_path: Path, redis: Transport, unique: str) -> None:
    """A dry run counts by state and produces nothing; --id picks single rows."""
    clock = FakeClock()
    store = SqliteLogStore(tmp_path / "log.db", clock=clock)
    await store.open()
    topic = f"t-{unique}"
    await make_topic(redis, topic, 1)
    rows = await seed(store, clock, topic)
    dry = await replay(store, None, Selection(), dry_run=True)
    assert dry.matched == {RowState.PROCESSED: 2, RowState.PRODUCED: 4, RowState.RECEIVED: 6}
    assert dry.replayed == 0
    info = await redis.admin().list_topics()
    assert info[topic].message_count == 0
    picked = await replay(store, redis.producer(), Selection(ids=(rows[10].id, rows[0].id)))
    assert picked.replayed == 2
    await store.close()


async def test_replay_respects_the_rate_cap(tmp_path: Path, redis: Transport, unique: str) -> None:
    """Twenty rows at 50/s go in pages of 5, 0.1 s apart: at least 0.3 s in all."""
    clock = FakeClock()
    store = SqliteLogStore(tmp_path / "log.db", clock=clock)
    await store.open()
    topic = f"t-{unique}"
    await make_topic(redis, topic, 1)
    for n in range(20):
        await store.insert(new_row(n, clock, topic=topic))
    started = time.monotonic()
    summary = await replay(store, redis.producer(), Selection(), rate_per_s=50)
    assert summary.replayed == 20
    assert time.monotonic() - started >= 0.29
    await store.close()


async def test_replaying_an_abandoned_row_puts_it_back_under_watch(
    tmp_path: Path, redis: Transport, unique: str
) -> None:
    """A hand replay of an abandoned row makes it produced again, so it can be processed."""
    clock = FakeClock()
    store = SqliteLogStore(tmp_path / "log.db", clock=clock)
    await store.open()
    topic = f"t-{unique}"
    await make_topic(redis, topic, 1)
    row = new_row(1, clock, topic=topic)
    await store.insert(row)
    await store.abandon([row.id], "poison")
    await replay(store, redis.producer(), Selection(states=(RowState.ABANDONED,)))
    got = await store.get(row.id)
    assert got is not None
    assert (got.state, got.replay_count) == (RowState.PRODUCED, 0)
    assert await store.mark_processed([row.id]) == 1
    await store.close()


def test_cli_replay_dry_run_and_purge(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, redis_service: str
) -> None:
    """`replay --dry-run` prints the counts per state; `purge` deletes old finished rows."""
    db = tmp_path / "ingress.db"
    monkeypatch.setenv("PIPELINE_INGRESS__SQLITE_PATH", str(db))
    monkeypatch.setenv("PIPELINE_TRANSPORT", "redis")

    async def prepare() -> None:
        clock = FakeClock(start_s=time.time() - 40 * 86_400)
        store = SqliteLogStore(db, clock=clock)
        await store.open()
        for n in range(3):
            await store.insert(new_row(n, clock, source="shop"))
        await store.mark_processed([r.id for r in await store.select(Selection(), limit=1)])
        await store.close()

    asyncio.run(prepare())
    runner = CliRunner()
    result = runner.invoke(ops_app, ["replay", "--dry-run", "--source", "shop"])
    assert result.exit_code == 0, result.output
    assert "received" in result.output
    assert "total" in result.output
    bad = runner.invoke(ops_app, ["replay", "--dry-run", "--since", "yesterday"])
    assert bad.exit_code == 2
    assert "--since" in bad.output
    purged = runner.invoke(ops_app, ["purge", "--older-than", "30d"])
    assert purged.exit_code == 0, purged.output
    assert "purged 1 rows" in purged.output


@pytest.mark.parametrize(("stop", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
async def test_a_replay_stopped_says_how_far_it_got(
    tmp_path: Path, redis: Transport, unique: str, stop: signal.Signals, code: int
) -> None:
    """`pipeline replay` stopped by Ctrl-C or SIGTERM says on one line how far it got."""
    db = tmp_path / "log.db"
    store = SqliteLogStore(db, clock=FakeClock(start_s=time.time()))
    await store.open()
    topic = f"t-{unique}"
    await make_topic(redis, topic, 1)
    for n in range(200):
        await store.insert(new_row(n, FakeClock(start_s=time.time()), topic=topic))
    await store.close()
    env = {
        **os.environ,
        "PIPELINE_INGRESS__SQLITE_PATH": str(db),
        "PIPELINE_TRANSPORT": "redis",
    }
    pipe = asyncio.subprocess.PIPE
    replaying = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "pipeline",
        "replay",
        "--rate",
        "40/s",
        env=env,
        stdout=pipe,
        stderr=pipe,
    )
    admin = redis.admin()
    stderr = await stopped_once_it_sent(replaying, admin, topic, stop, "the replay")
    assert replaying.returncode == code, stderr
    text = stderr.decode()
    assert "Traceback" not in text, text
    (said,) = [line for line in text.splitlines() if "error:" in line]
    assert "replay stopped by" in said
    assert " of 200 rows" in said
