"""A replay that cannot finish: the broker gone midway, rows that fail, an age window stopped.

Each says where it stopped and how to replay the rest, and passes over nothing in silence.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys
import time
from collections.abc import AsyncIterator
from datetime import datetime
from pathlib import Path

import pytest
from contract.helpers import make_topic
from ingress.redis_server import RedisServer
from logstore.helpers import FakeClock, new_row
from support import stopped_once_it_sent
from typer.testing import CliRunner

from pipeline.config import Settings
from pipeline.errors import BrokerUnavailable
from pipeline.ingress.cli import ops_app
from pipeline.ingress.replay import replay
from pipeline.logstore import RowState, Selection
from pipeline.logstore.sqlite import SqliteLogStore
from pipeline.transport import create_transport
from pipeline.transport.protocol import TopicConfig, Transport

_ISO = re.compile(r"--since (\S+Z) \(what --since 2h meant when it began\)")


@pytest.fixture
async def redis(settings: Settings, redis_service: str) -> AsyncIterator[Transport]:
    """The real Redis Streams transport."""
    transport = create_transport(settings, "redis")
    yield transport
    await transport.close()


async def test_a_broker_gone_midway_stops_the_replay_at_the_page_it_failed(
    tmp_path: Path, settings: Settings
) -> None:
    """Redis stopped after the first page: one page fails, the rest are left as they were.

    Before, every page after was attempted and failed in turn (on Kafka each after the message
    timeout), and the summary gave no sign of where the outage began.
    """
    server = RedisServer(tmp_path / "redis")
    server.start()
    transport = create_transport(
        settings.model_copy(
            update={"redis": settings.redis.model_copy(update={"url": server.url})}
        ),
        "redis",
    )
    store = SqliteLogStore(tmp_path / "log.db", clock=FakeClock(start_s=time.time()))
    await store.open()
    try:
        await transport.admin().create_topic(TopicConfig("replayed", 1))
        clock = FakeClock(start_s=time.time())
        for n in range(1000):
            await store.insert(new_row(n, clock, topic="replayed"))
            clock.advance(0.001)
        pages: list[int] = []

        def page_done(n: int) -> None:
            pages.append(n)
            if len(pages) == 1:
                server.stop()

        summary = await replay(store, transport.producer(), Selection(), progress=page_done)
        assert pages == [200, 200]
        assert isinstance(summary.stopped, BrokerUnavailable)
        assert (summary.replayed, summary.handled, summary.total) == (200, 400, 1000)
        assert summary.failed == {"BrokerUnavailable": 200}
        assert await store.count_by_state(Selection()) == {
            RowState.PRODUCED: 200,
            RowState.RECEIVED: 800,
        }
    finally:
        server.stop()
        await transport.close()
        await store.close()


def test_rows_that_fail_are_named_by_topic_and_the_rest_replayed(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    settings: Settings,
    redis_service: str,
    unique: str,
) -> None:
    """Rows to a topic that is gone get one line; the others go; exit 1 says not all did."""
    db = tmp_path / "ingress.db"
    monkeypatch.setenv("PIPELINE_INGRESS__SQLITE_PATH", str(db))
    monkeypatch.setenv("PIPELINE_TRANSPORT", "redis")
    kept, gone = f"kept-{unique}", f"gone-{unique}"

    async def prepare() -> None:
        redis = create_transport(settings, "redis")
        await make_topic(redis, kept, 1)
        await redis.close()
        clock = FakeClock(start_s=time.time() - 60)
        store = SqliteLogStore(db, clock=clock)
        await store.open()
        for n in range(8):
            await store.insert(new_row(n, clock, topic=gone if n % 4 == 1 else kept))
            clock.advance(1)
        await store.close()

    asyncio.run(prepare())
    started_ms = int(time.time() * 1000)
    result = CliRunner().invoke(ops_app, ["replay", "--since", "2h"])
    ended_ms = int(time.time() * 1000)
    assert result.exit_code == 1, result.output
    assert f"replayed 6 ({kept}: 6); failed: UnknownTopic: 2" in result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 2, result.output
    assert errors[0].startswith(f"error: 2 rows to {gone} failed: UnknownTopic:")
    assert errors[1].startswith("error: 2 of 8 rows were not replayed (above); once they can be,")
    _assert_pinned(errors[1], started_ms, ended_ms)


async def test_a_replay_of_an_age_stopped_says_the_time_to_run_it_again_with(
    tmp_path: Path, redis: Transport, unique: str
) -> None:
    """`--since 2h` stopped by SIGTERM names the time it meant, not the same command.

    The same command run later selects a later window: the rows that aged out of it since
    were passed over, unreached, with exit 0 and "failed: none".
    """
    db = tmp_path / "log.db"
    store = SqliteLogStore(db, clock=FakeClock(start_s=time.time()))
    await store.open()
    topic = f"t-{unique}"
    await make_topic(redis, topic, 1)
    clock = FakeClock(start_s=time.time() - 3600)
    for n in range(200):
        await store.insert(new_row(n, clock, topic=topic))
    await store.close()
    env = {**os.environ, "PIPELINE_INGRESS__SQLITE_PATH": str(db), "PIPELINE_TRANSPORT": "redis"}
    pipe = asyncio.subprocess.PIPE
    started_ms = int(time.time() * 1000)
    replaying = await asyncio.create_subprocess_exec(
        sys.executable,
        *("-m", "pipeline", "replay", "--since", "2h", "--rate", "40/s"),
        env=env,
        stdout=pipe,
        stderr=pipe,
    )
    admin = redis.admin()
    stderr = await stopped_once_it_sent(replaying, admin, topic, signal.SIGTERM, "the replay")
    ended_ms = int(time.time() * 1000)
    assert replaying.returncode == 143, stderr
    text = stderr.decode()
    (said,) = [line for line in text.splitlines() if "error:" in line]
    assert "replay stopped by SIGTERM after" in said
    assert "the same command would select a later window" in said
    assert "consumers drop repeats by event id" in said
    pinned = _assert_pinned(said, started_ms, ended_ms)
    assert f"replaying rows received since {pinned}" in text
    dry = await asyncio.create_subprocess_exec(
        sys.executable,
        *("-m", "pipeline", "replay", "--dry-run", "--since", pinned),
        env=env,
        stdout=pipe,
        stderr=pipe,
    )
    out, err = await asyncio.wait_for(dry.communicate(), 60)
    assert dry.returncode == 0, err
    assert re.search(r"total\s*│\s*200\b", out.decode()), out


def _assert_pinned(line: str, started_ms: int, ended_ms: int) -> str:
    """The ISO time ``line`` names for ``--since 2h``, which is 2 h before the run."""
    found = _ISO.search(line)
    assert found is not None, line
    pinned_ms = int(datetime.fromisoformat(found[1]).timestamp() * 1000)
    assert started_ms - 7_200_000 <= pinned_ms <= ended_ms - 7_200_000
    return found[1]
