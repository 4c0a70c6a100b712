"""A Redis that lost its data while every member was down is reported at the next start.

The marker tells a loss only while a member runs: one missing at start was taken for a first
start. Every member stopped, the Redis flushed (or restarted empty), a member started again:
the followers held behind a parked key, their offsets committed, were gone without a word and
never ran. A marker missing at start now has the broker asked whether the group consumed the
lanes before: it has, one CRITICAL line and one count; it has not (a first start), nothing.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import pytest
from lane_support import partly_consumed
from redis.asyncio import Redis
from runtime.helpers import CountingAdmin, declare, idle_lane, produce
from runtime.private_redis import bare_client
from support import delete_group_after

from pipeline.config import KafkaSettings, Settings
from pipeline.envelope import Record
from pipeline.observability.metrics import Metrics
from pipeline.runtime.app import Lane
from pipeline.runtime.state_loss import GroupPositions, StateLostCounter, StateWatch, marker_key
from pipeline.testing.ports import free_port
from pipeline.transport import create_transport
from pipeline.transport.protocol import PartitionLag

LOGGER = "pipeline.runtime.state_loss"
GENEROUS_S = 60.0
"""The broker's bound at start in these tests: a loaded machine does not make them flake."""

FAILING_HEAD_APP = '''
from pipeline.runtime import App, Context

app = App()


@app.handler("{lane}")
async def handle(event: bytes, ctx: Context) -> None:
    """The head of key k fails (parked for its 1 h tier); its followers are held."""
    if event == b"head":
        raise RuntimeError("the head fails")
'''


def watching(
    client: Redis,
    url: str,
    prefix: str,
    group: str,
    lane: Lane,
    admin: GroupPositions,
    *,
    metrics: Metrics | None = None,
    timeout_s: float = GENEROUS_S,
) -> StateWatch:
    """The watch of the member of ``group`` running ``lane`` on the Redis at ``url``.

    With ``metrics``, its losses are counted there; ``timeout_s``: the broker's bound at start.
    """
    counter = None if metrics is None else StateLostCounter(metrics, group)
    return StateWatch(
        client, url, prefix, group, [lane], counter, admin=admin, consumed_timeout_s=timeout_s
    )


def lost_count(metrics: Metrics, group: str) -> float | None:
    """``pipeline_redis_state_lost_total`` of ``group``."""
    return metrics.registry.get_sample_value("pipeline_redis_state_lost_total", {"group": group})


async def held_and_committed(
    settings: Settings, tmp_path: Path, name: str, group: str, redis_url: str, prefix: str
) -> None:
    """``pipeline consume`` parks the head of key k and holds its 3 followers, then stops.

    Returns once the group committed all 4 offsets and the followers are held in Redis.
    """
    (tmp_path / "topics").mkdir()
    (tmp_path / "topics" / f"{name}.yaml").write_text(
        f"name: {name}\npartitions: 1\nordered: true\nretry:\n  tiers: [1h]\n"
    )
    (tmp_path / f"{name}.py").write_text(FAILING_HEAD_APP.format(lane=name))
    env = {
        **os.environ,
        "PIPELINE_TRANSPORT": "kafka",
        "PIPELINE_KAFKA__BOOTSTRAP_SERVERS": settings.kafka.bootstrap_servers,
        "PIPELINE_REDIS__URL": redis_url,
        "PIPELINE_REDIS__KEY_PREFIX": prefix,
        "PIPELINE_TOPICS_DIR": str(tmp_path / "topics"),
        "PIPELINE_MEMBERSHIP__SLOT_DIR": str(tmp_path / "slots"),
        "PIPELINE_RUNTIME__METRICS_PORT": str(free_port()),
    }
    log_path = tmp_path / "consume.log"
    with log_path.open("wb") as log_file:
        proc = await asyncio.create_subprocess_exec(
            *(sys.executable, "-m", "pipeline", "consume", f"{name}:app", "-g", group),
            cwd=str(tmp_path),
            env=env,
            stderr=log_file,
        )
    transport = create_transport(settings, "kafka")
    client = Redis.from_url(redis_url)
    try:
        admin = transport.admin()
        deadline = time.monotonic() + 60
        while True:
            assert proc.returncode is None, log_path.read_text()
            assert time.monotonic() < deadline, log_path.read_text()
            lag = await admin.group_lag(group, name)
            if [p.committed for p in lag] == [4] and await client.keys(f"*{prefix}:guard*:h:*"):
                break
            await asyncio.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 60) == 0, log_path.read_text()
    finally:
        await client.aclose()
        await transport.close()
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


def messages(caplog: pytest.LogCaptureFixture) -> Sequence[str]:
    """The lines the watch logged."""
    return [r.getMessage() for r in caplog.records if r.name == LOGGER]


async def test_a_loss_while_every_member_was_down_is_reported_once_at_start(
    settings: Settings,
    kafka_service: str,
    tmp_path: Path,
    unique: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Held followers committed, every member stopped, FLUSHALL: the next start says so once."""
    name, group, prefix = f"las_{unique}", f"g-{unique}", f"t{unique}"
    lane = idle_lane(name, retry={"tiers": ["1h"]})
    transport = create_transport(settings, "kafka")
    metrics = Metrics()
    try:
        await declare(transport, lane.spec)
        delete_group_after(transport, group, lane.spec.topic_names())
        await produce(transport, name, [Record(v, b"k") for v in (b"head", b"f1", b"f2", b"f3")])
        async with bare_client() as (server, client):
            await held_and_committed(settings, tmp_path, name, group, server.url, prefix)
            assert await client.exists(marker_key(prefix)) == 1
            await client.flushall()  # no member runs: none of them can see it
            starts = [
                watching(client, server.url, prefix, group, lane, transport.admin())
                for _ in range(2)
            ]
            with caplog.at_level(logging.DEBUG, logger=LOGGER):
                assert await starts[0].start() is True
                # Its metrics come after the start: the loss is counted once they exist.
                starts[0].counter = StateLostCounter(metrics, group)
                assert await starts[1].start() is False  # another member: the marker is back
                assert await starts[0].check() is False
    finally:
        await transport.close()
    (line,) = messages(caplog)
    assert [r.levelno for r in caplog.records if r.name == LOGGER] == [logging.CRITICAL]
    assert "\n" not in line
    assert f"Redis {server.url} holds no state-loss marker {marker_key(prefix)}" in line
    assert f"although group {group} has consumed {name} before" in line
    assert "or it is a new or another Redis" in line
    assert f"held followers of parked keys (lanes {name}) it had may be gone" in line
    assert f"still in their topics (held: {name})" in line
    assert "docs/operations.md#redis-or-kafka-outage" in line
    assert "appendonly yes and appendfsync everysec" in line
    assert lost_count(metrics, group) == 1.0


async def test_a_first_start_of_a_new_group_says_nothing(
    settings: Settings, kafka_service: str, unique: str, caplog: pytest.LogCaptureFixture
) -> None:
    """No marker and a group that never committed: a first start, nothing logged or counted."""
    name, group, prefix = f"fs_{unique}", f"g-{unique}", f"t{unique}"
    lane = idle_lane(name, retry={"tiers": ["5s"]})
    transport = create_transport(settings, "kafka")
    metrics = Metrics()
    try:
        await declare(transport, lane.spec)
        await produce(transport, name, [Record(b"waiting", b"k")])  # not consumed yet
        admin = CountingAdmin(transport.admin())
        async with bare_client() as (server, client):
            watch = watching(
                client,
                server.url,
                prefix,
                group,
                lane,
                admin,
                metrics=metrics,
            )
            with caplog.at_level(logging.DEBUG, logger=LOGGER):
                assert await watch.start() is False
            assert await client.exists(marker_key(prefix)) == 1
    finally:
        await transport.close()
    assert admin.calls == 1  # the marker was missing: the broker was asked, once
    assert messages(caplog) == []
    assert lost_count(metrics, group) == 0.0


async def test_a_restart_with_the_marker_intact_says_nothing(
    settings: Settings, kafka_service: str, unique: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The group consumed, the marker is there: nothing said, and the broker is not asked."""
    name, group, prefix = f"ri_{unique}", f"g-{unique}", f"t{unique}"
    lane = idle_lane(name, retry={"tiers": ["5s"]})
    transport = create_transport(settings, "kafka")
    metrics = Metrics()
    try:
        admin = CountingAdmin(transport.admin())
        async with bare_client() as (server, client):
            first = watching(client, server.url, prefix, group, lane, admin)
            assert await first.start() is False  # a first start: the group is new
            async with partly_consumed(transport, lane.spec, group, produced=3, committed=3):
                restarted = watching(
                    client,
                    server.url,
                    prefix,
                    group,
                    lane,
                    admin,
                    metrics=metrics,
                )
                with caplog.at_level(logging.DEBUG, logger=LOGGER):
                    assert await restarted.start() is False
    finally:
        await transport.close()
    assert admin.calls == 1  # at the first start only
    assert messages(caplog) == []
    assert lost_count(metrics, group) == 0.0


async def test_a_broker_that_does_not_answer_is_a_debug_line_only(
    unique: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Kafka at a closed port: the start goes on after its bound, with one DEBUG line."""
    name, group, prefix = f"na_{unique}", f"g-{unique}", f"t{unique}"
    lane = idle_lane(name, retry={"tiers": ["5s"]})
    silent = Settings(kafka=KafkaSettings(bootstrap_servers=f"127.0.0.1:{free_port()}"))
    transport = create_transport(silent, "kafka")
    try:
        async with bare_client() as (server, client):
            watch = watching(
                client, server.url, prefix, group, lane, transport.admin(), timeout_s=0.5
            )
            with caplog.at_level(logging.DEBUG, logger=LOGGER):
                assert await watch.start() is False
    finally:
        await transport.close()
    assert [r.levelno for r in caplog.records if r.name == LOGGER] == [logging.DEBUG]
    (line,) = messages(caplog)
    assert f"did not say whether group {group} consumed {name} before" in line
    assert "no answer within 0.5s" in line


async def test_on_the_redis_transport_the_broker_is_not_asked(unique: str) -> None:
    """The streams and positions were in the Redis that lost the marker: nothing to ask."""
    name, group, prefix = f"nr_{unique}", f"g-{unique}", f"t{unique}"
    lane = idle_lane(name, retry={"tiers": ["5s"]})

    class Refusing:
        async def group_lag(self, group: str, topic: str) -> list[PartitionLag]:
            raise AssertionError(f"asked about {group} on {topic}")

    async with bare_client() as (server, client):
        watch = StateWatch(
            client, server.url, prefix, group, [lane], topics_in_redis=True, admin=Refusing()
        )
        assert await watch.start() is False
