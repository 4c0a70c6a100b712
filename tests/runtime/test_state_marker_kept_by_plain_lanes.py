"""A lane that begins keeping messages in Redis is not taken for a Redis that lost its data.

Members whose lanes kept nothing only in Redis wrote no state marker, while their group
committed offsets: the first start after ``retry:`` was added to the ordered lane found the
marker missing and the group's commits, and paged (CRITICAL, ``pipeline_redis_state_lost_total``)
though nothing was lost. Every member writes the marker now; only those keeping state watch it.
"""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

from redis.asyncio import Redis
from runtime.helpers import declare, lane_spec, write_idle_app
from runtime.private_redis import bare_redis
from support import delete_group_after
from test_redis_state_lost import consume, next_line
from test_state_lost_before_start_consume import _commit

from pipeline.config import Settings
from pipeline.runtime.state_loss import marker_key
from pipeline.transport import create_transport


async def _run_until_consuming(tmp_path: Path, name: str, group: str, env: dict[str, str]) -> str:
    """Start `pipeline consume`, stop it (SIGTERM) once it consumes; its log up to then."""
    proc = await consume(tmp_path, f"{name}:app", group, env)
    assert proc.stderr is not None
    lines: list[str] = []
    try:
        await next_line(proc.stderr, lines, "consuming as group")
        proc.send_signal(signal.SIGTERM)
        _, rest = await asyncio.wait_for(proc.communicate(), 60)
        lines += rest.decode().splitlines(keepends=True)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 0, "".join(lines)
    return "".join(lines)


async def test_adding_retry_to_a_lane_its_group_consumed_is_no_loss(
    settings: Settings, kafka_service: str, tmp_path: Path, unique: str
) -> None:
    """Plain lane run first (marker written), then with tiers: no missing-marker line."""
    name, group, prefix = f"plain_{unique}", f"g-{unique}", f"t{unique}"
    spec = lane_spec(name, 1, retry={"tiers": ["1s"]})  # its tier topics exist for the 2nd run
    transport = create_transport(settings, "kafka")
    try:
        await declare(transport, spec)
        delete_group_after(transport, group, spec.topic_names())
        producer = transport.producer()
        try:
            await producer.send(name, b"consumed before", key=b"k")
        finally:
            await producer.close()
    finally:
        await transport.close()
    await asyncio.to_thread(_commit, kafka_service, group, name, 1)  # the group consumed before
    write_idle_app(tmp_path, name)
    declared = tmp_path / "topics" / f"{name}.yaml"
    with_tiers = declared.read_text()
    declared.write_text(f"name: {name}\npartitions: 1\n")  # first: nothing kept in Redis
    with bare_redis() as server:
        env = {
            **os.environ,
            "PIPELINE_TRANSPORT": "kafka",
            "PIPELINE_KAFKA__BOOTSTRAP_SERVERS": kafka_service,
            "PIPELINE_REDIS__URL": server.url,
            "PIPELINE_REDIS__KEY_PREFIX": prefix,
            "PIPELINE_TOPICS_DIR": str(tmp_path / "topics"),
            "PIPELINE_MEMBERSHIP__SLOT_DIR": str(tmp_path / "slots"),
        }
        await _run_until_consuming(tmp_path, name, group, env)
        client = Redis.from_url(server.url)
        try:
            assert await client.hget(marker_key(prefix), "epoch") is not None
        finally:
            await client.aclose()
        declared.write_text(with_tiers)  # then: an ordered lane with a tier holds followers
        log = await _run_until_consuming(tmp_path, name, group, env)
    assert "holds no state-loss marker" not in log, log
    assert "CRITICAL" not in log, log
