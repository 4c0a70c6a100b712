"""Operator commands run twice, or at the wrong thing, as a careless operator would (real Redis)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import yaml
from logstore.helpers import FakeClock, new_row
from runtime.helpers import declare, lane_spec
from support import delete_group_after, test_settings

from pipeline import headers as h
from pipeline.config import Settings
from pipeline.envelope import Message
from pipeline.errors import DeadLetter
from pipeline.logstore import Selection as LogSelection
from pipeline.logstore.sqlite import SqliteLogStore
from pipeline.redrive.redrive import group_name
from pipeline.redrive.select import Selection
from pipeline.retry.policy import Backoff
from pipeline.retry.router import LaneRoutes, RetryRouter
from pipeline.transport import create_transport
from pipeline.transport.protocol import Transport


def pipeline_cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run ``pipeline ARGS`` in a subprocess, as an operator would."""
    return subprocess.run(
        [sys.executable, "-m", "pipeline", *args],
        capture_output=True,
        text=True,
        timeout=90,
        env={**os.environ, **env},
        check=False,
    )


@pytest.fixture
async def redis_transport(redis_service: str, settings: Settings) -> AsyncIterator[Transport]:
    """The Redis Streams transport of the test settings."""
    del redis_service
    transport = create_transport(settings, "redis")
    yield transport
    await transport.close()


async def _dead_letters(transport: Transport, tmp_path: Path, name: str, count: int) -> LaneRoutes:
    """Declare ``name`` (file and broker) and dead-letter ``count`` messages of it."""
    spec = lane_spec(name, 1)
    (tmp_path / f"{name}.yaml").write_text(
        yaml.safe_dump({"name": name, "partitions": 1}), encoding="utf-8"
    )
    await declare(transport, spec)
    routes = LaneRoutes(spec.name, (), spec.dead_letter, 1, Backoff(()))
    router = RetryRouter(transport.producer())
    for i in range(count):
        message = Message(spec.name, 0, i, b"k%d" % i, b"v%d" % i, {h.EVENT_ID: b"e%d" % i})
        await router.dead_letter(routes, message, "fatal", DeadLetter("bad"))
    return routes


async def _drop(transport: Transport, *topics: str) -> None:
    for topic in topics:
        await transport.admin().delete_topic(topic)


async def test_redrive_run_twice_with_an_age_moves_each_message_once(
    redis_transport: Transport, tmp_path: Path, unique: str
) -> None:
    """``pipeline redrive <dlq> --since 2h`` run twice moves 5 dead letters into 5 messages."""
    routes = await _dead_letters(redis_transport, tmp_path, f"rd_{unique}", 5)
    env = {"PIPELINE_TOPICS_DIR": str(tmp_path), "PIPELINE_TRANSPORT": "redis"}
    # The command keeps its group (its resume position); the test deletes it afterwards.
    group = group_name(routes.dead_letter_topic, None, Selection.typed_as(since="2h"))
    delete_group_after(redis_transport, group, [routes.dead_letter_topic])
    try:
        first = await asyncio.to_thread(
            pipeline_cli, "redrive", routes.dead_letter_topic, "--since", "2h", env=env
        )
        second = await asyncio.to_thread(
            pipeline_cli, "redrive", routes.dead_letter_topic, "--since", "2h", env=env
        )
        topics = await redis_transport.admin().list_topics([routes.topic])
    finally:
        await _drop(redis_transport, routes.topic, routes.dead_letter_topic)
    assert (first.returncode, second.returncode) == (0, 0), first.stderr + second.stderr
    assert topics[routes.topic].message_count == 5


async def test_redrive_refuses_a_topic_that_is_not_a_dead_letter_topic(
    redis_transport: Transport, tmp_path: Path, unique: str
) -> None:
    """Redriving a main topic exits 2 with one line naming the declared dead-letter topics."""
    routes = await _dead_letters(redis_transport, tmp_path, f"rd_{unique}", 1)
    env = {"PIPELINE_TOPICS_DIR": str(tmp_path), "PIPELINE_TRANSPORT": "redis"}
    try:
        result = await asyncio.to_thread(pipeline_cli, "redrive", routes.topic, env=env)
        topics = await redis_transport.admin().list_topics([routes.topic])
    finally:
        await _drop(redis_transport, routes.topic, routes.dead_letter_topic)
    assert result.returncode == 2
    assert "is not a dead-letter topic" in result.stderr
    assert routes.dead_letter_topic in result.stderr
    assert "Traceback" not in result.stderr
    assert topics[routes.topic].message_count == 0


def _seed_log(db: Path, topic: str) -> None:
    """Rows of one topic: processed today, received today, received 20 days ago."""

    async def seed() -> None:
        old_clock = FakeClock(start_s=time.time() - 20 * 86_400)
        clock = FakeClock(start_s=time.time() - 60)
        store = SqliteLogStore(db, clock=clock)
        await store.open()
        await store.insert(new_row(0, clock, topic=topic, event_id="done"))
        await store.mark_processed([r.id for r in await store.select(LogSelection(), limit=1)])
        await store.insert(new_row(1, clock, topic=topic, event_id="waiting"))
        await store.insert(new_row(2, old_clock, topic=topic, event_id="forgotten"))
        await store.close()

    asyncio.run(seed())


def _replay(tmp_path: Path, unique: str, *args: str) -> tuple[int, str, int]:
    """Run ``pipeline replay ARGS`` over a seeded log; exit code, output, events produced."""
    topic = f"rp_{unique}"
    (tmp_path / "topics").mkdir()
    (tmp_path / "topics" / "t.yaml").write_text(f"name: {topic}\npartitions: 1\n")
    db = tmp_path / "ingress.db"
    _seed_log(db, topic)
    env = {
        "PIPELINE_TOPICS_DIR": str(tmp_path / "topics"),
        "PIPELINE_TRANSPORT": "redis",
        "PIPELINE_INGRESS__SQLITE_PATH": str(db),
    }

    async def produced() -> tuple[int, str, int]:
        transport = create_transport(test_settings(topics_dir=tmp_path / "topics"), "redis")
        try:
            await declare(transport, lane_spec(topic, 1))
            result = await asyncio.to_thread(pipeline_cli, "replay", *args, env=env)
            count = (await transport.admin().list_topics([topic]))[topic].message_count
            await _drop(transport, topic, f"{topic}.dlq")
        finally:
            await transport.close()
        return result.returncode, result.stdout + result.stderr, count

    return asyncio.run(produced())


def test_replay_skips_processed_rows_unless_asked(
    tmp_path: Path, unique: str, redis_service: str
) -> None:
    """``pipeline replay --since 1d`` re-sends the waiting row, not the processed one."""
    del redis_service
    code, output, produced = _replay(tmp_path, unique, "--since", "1d")
    assert code == 0, output
    assert produced == 1


def test_replay_refuses_rows_beyond_the_idempotency_memory(
    tmp_path: Path, unique: str, redis_service: str
) -> None:
    """A replay reaching rows older than 14 days exits 2 and sends nothing without ``--force``."""
    del redis_service
    code, output, produced = _replay(tmp_path, unique)
    assert code == 2
    assert "idempotency memory" in output
    assert "Traceback" not in output
    assert produced == 0
