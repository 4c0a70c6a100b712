"""A member says so when its Redis loses its data, held followers and buffers with it.

Before, a Redis restarted empty (or flushed) under a member took the followers held behind a
parked key with it, and nothing said so: they never ran, with no log line and no metric.
"""

from __future__ import annotations

import asyncio
import logging
import re
import signal
import time
import urllib.request
from pathlib import Path

import pytest
from redis.asyncio import Redis
from runtime.helpers import (
    consuming,
    declare,
    idle_lane,
    lane_spec,
    logged_until,
    private_member_env,
    write_idle_app,
)
from runtime.private_redis import bare_client, bare_redis
from support import delete_group_after

from pipeline.config import Settings
from pipeline.observability.metrics import Metrics
from pipeline.runtime.state_loss import StateLostCounter, StateWatch, marker_key
from pipeline.testing.ports import free_port
from pipeline.transport import create_transport


async def lost_count(port: int, group: str, expected: float) -> None:
    """Scrape the member's /metrics until its group's loss count is ``expected``."""
    sample = re.compile(
        rf'^pipeline_redis_state_lost_total\{{group="{group}"\}} (\S+)$', re.MULTILINE
    )
    url = f"http://127.0.0.1:{port}/metrics"
    deadline = time.monotonic() + 60
    seen = None
    while time.monotonic() < deadline:
        body = await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=5).read())
        found = sample.search(body.decode())
        seen = None if found is None else float(found.group(1))
        if seen == expected:
            return
        await asyncio.sleep(0.2)
    raise AssertionError(f"pipeline_redis_state_lost_total is {seen}, not {expected}")


async def marked_again(client: Redis, key: str) -> None:
    """Wait until the member has written its marker ``key`` again (right after its line)."""
    deadline = time.monotonic() + 60
    while await client.hget(key, "epoch") is None:
        assert time.monotonic() < deadline, f"{key} was not written again"
        await asyncio.sleep(0.02)


def says_what_was_lost(line: str, url: str, lane: str, group: str) -> None:
    """``line`` is CRITICAL and names the Redis, the loss, where the messages are, the fix."""
    assert "CRITICAL" in line
    assert url in line
    assert f"held followers of parked keys (lanes {lane})" in line
    assert f"Group {group} committed their offsets" in line
    assert f"(held: {lane})" in line
    assert "docs/operations.md#redis-or-kafka-outage" in line
    assert "appendonly yes and appendfsync everysec" in line


async def test_a_member_reports_its_redis_flushed_then_restarted_empty(
    settings: Settings, kafka_service: str, tmp_path: Path, unique: str
) -> None:
    """FLUSHALL, then a restart without persistence: one CRITICAL line and one count each."""
    name, group, prefix = f"lost_{unique}", f"g-{unique}", f"t{unique}"
    spec = lane_spec(name, 1, retry={"tiers": ["1s"]})  # ordered: followers are held in Redis
    transport = create_transport(settings, "kafka")
    try:
        await declare(transport, spec)
        delete_group_after(transport, group, spec.topic_names())
    finally:
        await transport.close()
    write_idle_app(tmp_path, name)
    metrics_port = free_port()
    with bare_redis() as server:
        env = {
            **private_member_env(tmp_path, kafka_service, server.url, prefix, metrics_port),
            # /metrics is a snapshot: at the default 15 s, each count below waited out a refresh
            "PIPELINE_RUNTIME__METRICS_INTERVAL_S": "0.5",
        }
        lines: list[str] = []
        client = Redis.from_url(server.url)
        try:
            async with consuming(tmp_path, f"{name}:app", group, env) as proc:
                await logged_until(proc, lines, "consuming as group")
                assert await client.hget(marker_key(prefix), "epoch") is not None
                await lost_count(metrics_port, group, 0.0)
                await client.flushall()
                flushed = await logged_until(proc, lines, "lost its data")
                await lost_count(metrics_port, group, 1.0)
                await marked_again(client, marker_key(prefix))
                await client.aclose()
                server.stop()
                server.start()
                client = Redis.from_url(server.url)
                restarted = await logged_until(proc, lines, "lost its data")
                await lost_count(metrics_port, group, 2.0)
                proc.send_signal(signal.SIGTERM)
                _, rest = await asyncio.wait_for(proc.communicate(), 60)
                lines += rest.decode().splitlines(keepends=True)
        finally:
            await client.aclose()
    assert proc.returncode == 0, "".join(lines)
    assert len([line for line in lines if "lost its data" in line]) == 2, "".join(lines)
    assert not [line for line in lines if "Task" in line or "Traceback" in line], "".join(lines)
    for line in (flushed, restarted):
        says_what_was_lost(line, server.url, name, group)
    assert f"marker {marker_key(prefix)} gone" in flushed


async def test_members_sharing_a_redis_each_report_one_loss_once(
    unique: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Two members, one FLUSHALL: one line and one count each, then nothing more."""
    name, prefix = f"shared_{unique}", f"t{unique}"
    lanes = [idle_lane(name, retry={"tiers": ["1s"]})]
    metrics = Metrics()
    async with bare_client() as (server, client):
        watches = [
            StateWatch(client, server.url, prefix, group, lanes, StateLostCounter(metrics, group))
            for group in ("g-a", "g-b")
        ]
        for watch in watches:
            await watch.start()
        assert [await watch.check() for watch in watches] == [False, False]
        await client.flushall()
        with caplog.at_level(logging.CRITICAL, logger="pipeline.runtime.state_loss"):
            assert [await watch.check() for watch in watches] == [True, True]
            assert [await watch.check() for watch in watches] == [False, False]
    assert [r.levelno for r in caplog.records] == [logging.CRITICAL] * 2
    assert f"marker {marker_key(prefix)} gone" in caplog.records[0].getMessage()
    # The second found the marker the first wrote again.
    assert f"marker {marker_key(prefix)} changed" in caplog.records[1].getMessage()
    for group in ("g-a", "g-b"):
        count = metrics.registry.get_sample_value(
            "pipeline_redis_state_lost_total", {"group": group}
        )
        assert count == 1.0


async def test_on_the_redis_transport_the_line_says_the_topics_went_too(
    unique: str, caplog: pytest.LogCaptureFixture
) -> None:
    """``PIPELINE_TRANSPORT=redis``: the topics were in that Redis, so they are not where to look.

    The line said the lost messages were still in their topics below the group's positions; on
    the Redis Streams transport the streams and the positions are in the Redis that lost its
    data, and went with it (a FLUSHALL under ``pipeline consume`` there stops it at its next
    poll: its topics no longer exist; a rollback to an older snapshot leaves it running).
    """
    name, prefix = f"rs_{unique}", f"t{unique}"
    lanes = [idle_lane(name, retry={"tiers": ["1s"]})]
    async with bare_client() as (server, client):
        watch = StateWatch(client, server.url, prefix, "g-rs", lanes, topics_in_redis=True)
        await watch.start()
        await client.flushall()
        with caplog.at_level(logging.CRITICAL, logger="pipeline.runtime.state_loss"):
            assert await watch.check() is True
    (record,) = caplog.records
    line = record.getMessage()
    assert "still in their topics" not in line, line
    assert "PIPELINE_TRANSPORT=redis" in line
    assert f"their topics ({name}) were in this Redis and went with it" in line
