"""The sweeper leaves a webhook whose event still waits in its lane's debounce buffer."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from logstore.helpers import FakeClock, new_row
from redis.asyncio import Redis
from runtime.helpers import declare, lane_spec

from pipeline.admission.debounce import Debouncer
from pipeline.admission.debounce import keys as debounce_keys
from pipeline.config import IngressSettings, RedisSettings, Settings, SweeperSettings
from pipeline.envelope import Message
from pipeline.ingress import headers as h
from pipeline.ingress.service import build_sweeper
from pipeline.ingress.sweeper import Sweeper
from pipeline.logstore import LogRow, LogStore, RowState
from pipeline.logstore.sqlite import SqliteLogStore
from pipeline.topics.spec import TopicSpec
from pipeline.transport import create_transport
from pipeline.transport.protocol import Transport

WINDOW = {"key": "conversation_id", "quiet_s": 60, "max_wait_s": 120, "max_batch": 1}
PAST_ALL_WAITS_S = 2_000  # past patience (300 s) plus the window (120 s), and max_patience_s


async def buffered_row(
    streams: Transport,
    redis: Redis,
    store: LogStore,
    clock: FakeClock,
    spec: TopicSpec,
    prefix: str,
    *,
    leased: bool,
) -> LogRow:
    """A produced row whose event its lane's debouncer holds (its turn due, or leased for 1 h)."""
    await declare(streams, spec)
    row = new_row(1, clock, topic=spec.name, lane=spec.lane)
    await store.insert(row)
    await store.mark_produced([row.id])
    assert spec.debounce is not None
    debouncer = Debouncer(redis, prefix, spec.lane, spec.debounce, lease_ms=3_600_000)
    headers = {h.ROW_ID: row.id.encode(), h.EVENT_ID: row.event_id.encode()}
    body = json.dumps({"conversation_id": "c1"}).encode()
    assert await debouncer.record("c1", Message(spec.name, 0, 0, b"c1", body, headers, 1)) > 0
    if leased:
        assert len((await debouncer.claim(10)).turns) == 1  # its turn runs, a long one
    got = await store.get(row.id)
    assert got is not None
    return got


def sweeper_of(
    streams: Transport, store: LogStore, clock: FakeClock, spec: TopicSpec, redis: RedisSettings
) -> Sweeper:
    """The ingress's sweeper of ``spec``'s lane on ``clock``, asking the debouncer's Redis."""
    ingress = IngressSettings(sweeper=SweeperSettings(lane_groups={spec.lane: "g-none"}))
    return build_sweeper(
        store, streams.producer(), streams.admin(), [spec], ingress, clock=clock, redis=redis
    )


@pytest.mark.parametrize("leased", [True, False], ids=["leased", "due"])
async def test_a_row_whose_event_stays_buffered_is_neither_replayed_nor_abandoned(
    streams: Transport,
    redis: Redis,
    store: LogStore,
    clock: FakeClock,
    settings: Settings,
    unique: str,
    caplog: pytest.LogCaptureFixture,
    leased: bool,
) -> None:
    """A row whose event still waits in the debounce buffer past every wait is left, not spent."""
    spec = lane_spec(f"chats_{unique}", 1, debounce=WINDOW)
    prefix = f"t{unique}"
    row = await buffered_row(streams, redis, store, clock, spec, prefix, leased=leased)
    redis_settings = settings.redis.model_copy(update={"key_prefix": prefix})
    sweeper = sweeper_of(streams, store, clock, spec, redis_settings)
    try:
        for _ in range(SweeperSettings().max_replays + 2):
            clock.advance(PAST_ALL_WAITS_S)
            await sweeper.sweep_once()
    finally:
        await sweeper.close()
    got = await store.get(row.id)
    assert got is not None
    assert (got.state, got.replay_count) == (RowState.PRODUCED, 0)
    assert (sweeper.totals.replayed, sweeper.totals.abandoned) == (0, 0)
    assert not [r for r in caplog.records if r.levelno >= logging.CRITICAL]


async def test_rows_of_a_conversation_with_more_than_64_events_buffered_are_all_left(
    streams: Transport,
    redis: Redis,
    store: LogStore,
    clock: FakeClock,
    settings: Settings,
    unique: str,
) -> None:
    """Every row of a conversation with 70 events waiting for its turn, not its last 64, is left."""
    window = {**WINDOW, "max_batch": 100}
    spec = lane_spec(f"chats_{unique}", 1, debounce=window)
    prefix = f"t{unique}"
    await declare(streams, spec)
    assert spec.debounce is not None
    debouncer = Debouncer(redis, prefix, spec.lane, spec.debounce, lease_ms=3_600_000)
    body = json.dumps({"conversation_id": "c1"}).encode()
    for n in range(70):
        row = new_row(n, clock, topic=spec.name, lane=spec.lane)
        await store.insert(row)
        await store.mark_produced([row.id])
        headers = {h.ROW_ID: row.id.encode(), h.EVENT_ID: row.event_id.encode()}
        assert await debouncer.record("c1", Message(spec.name, 0, n, b"c1", body, headers, 1)) > 0
    redis_settings = settings.redis.model_copy(update={"key_prefix": prefix})
    sweeper = sweeper_of(streams, store, clock, spec, redis_settings)
    try:
        clock.advance(PAST_ALL_WAITS_S)
        report = await sweeper.sweep_once()
    finally:
        await sweeper.close()
    assert (report.replayed, report.buffered) == (0, 70)


async def test_a_row_whose_buffered_state_is_gone_is_replayed(
    streams: Transport,
    redis: Redis,
    store: LogStore,
    clock: FakeClock,
    settings: Settings,
    unique: str,
) -> None:
    """With the lane's debounce state gone from Redis, a row past its waits is replayed."""
    spec = lane_spec(f"chats_{unique}", 1, debounce=WINDOW)
    prefix = f"t{unique}"
    row = await buffered_row(streams, redis, store, clock, spec, prefix, leased=True)
    async for key in redis.scan_iter(match=f"{debounce_keys.lane_tag(prefix, spec.lane)}*"):
        await redis.delete(key)
    redis_settings = settings.redis.model_copy(update={"key_prefix": prefix})
    sweeper = sweeper_of(streams, store, clock, spec, redis_settings)
    try:
        clock.advance(PAST_ALL_WAITS_S)
        report = await sweeper.sweep_once()
    finally:
        await sweeper.close()
    assert report.replayed == 1
    got = await store.get(row.id)
    assert got is not None
    assert (got.state, got.replay_count) == (RowState.PRODUCED, 1)


async def test_pipeline_sweep_leaves_a_buffered_row_as_the_ingress_does(
    redis: Redis, settings: Settings, unique: str, tmp_path: Path
) -> None:
    """`pipeline sweep` asks the debouncer too: a row whose event is held is not replayed."""
    prefix = f"t{unique}"
    local = settings.model_copy(
        update={"redis": settings.redis.model_copy(update={"key_prefix": prefix})}
    )
    spec = lane_spec(f"chats_{unique}", 1, debounce=WINDOW)
    clock = FakeClock(time.time() - PAST_ALL_WAITS_S)  # received long before every wait
    streams = create_transport(local, "redis")
    store = SqliteLogStore(tmp_path / "log.db", clock=clock)
    await store.open()
    try:
        row = await buffered_row(streams, redis, store, clock, spec, prefix, leased=True)
    finally:
        await store.close()
        await streams.close()
    topics = tmp_path / "topics"
    topics.mkdir()
    (topics / "chats.yaml").write_text(
        yaml.safe_dump({"name": spec.name, "partitions": 1, "debounce": WINDOW})
    )
    env = {
        **os.environ,
        "PIPELINE_TOPICS_DIR": str(topics),
        "PIPELINE_TRANSPORT": "redis",
        "PIPELINE_REDIS__URL": local.redis.url,
        "PIPELINE_REDIS__KEY_PREFIX": prefix,
        "PIPELINE_INGRESS__SQLITE_PATH": str(tmp_path / "log.db"),
        "PIPELINE_INGRESS__SWEEPER__LANE_GROUPS": json.dumps({spec.lane: "g-none"}),
    }
    for _ in range(SweeperSettings().max_replays + 1):
        swept = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "pipeline", "sweep"],
            env=env,
            capture_output=True,
            text=True,
            check=True,
            timeout=120,
        )
        assert "replayed 0, abandoned 0" in swept.stdout, swept.stdout + swept.stderr
    store = SqliteLogStore(tmp_path / "log.db")
    await store.open()
    try:
        got = await store.get(row.id)
    finally:
        await store.close()
    assert got is not None
    assert (got.state, got.replay_count) == (RowState.PRODUCED, 0)
