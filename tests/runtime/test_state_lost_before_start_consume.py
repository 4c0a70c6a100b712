"""`pipeline consume` tells of a Redis that lost its data while no member of its group ran.

The group committed offsets on an ordered lane with retry tiers (its held followers were kept in
Redis only); that Redis then has no state marker: the member's start says so (CRITICAL) and
counts the loss, where it said nothing before.
"""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

from confluent_kafka import Consumer, TopicPartition
from runtime.helpers import declare, lane_spec, write_idle_app
from runtime.private_redis import bare_redis
from support import delete_group_after
from test_redis_state_lost import consume, lost_count, next_line

from pipeline.config import Settings
from pipeline.testing.ports import free_port
from pipeline.transport import create_transport


def _commit(bootstrap: str, group: str, topic: str, offset: int) -> None:
    """Group ``group`` commits ``offset`` on partition 0 of ``topic``, as a member once did."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        consumer.commit(offsets=[TopicPartition(topic, 0, offset)], asynchronous=False)
    finally:
        consumer.close()


async def test_consume_reports_a_loss_while_no_member_ran(
    settings: Settings, kafka_service: str, tmp_path: Path, unique: str
) -> None:
    """Offsets committed, an empty Redis: one CRITICAL line at start and the loss counted once."""
    name, group, prefix = f"lostb_{unique}", f"g-{unique}", f"t{unique}"
    spec = lane_spec(name, 1, retry={"tiers": ["1s"]})  # ordered: followers are held in Redis
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
    await asyncio.to_thread(_commit, kafka_service, group, name, 1)
    write_idle_app(tmp_path, name)
    metrics_port = free_port()
    with bare_redis() as server:
        env = {
            **os.environ,
            "PIPELINE_TRANSPORT": "kafka",
            "PIPELINE_KAFKA__BOOTSTRAP_SERVERS": kafka_service,
            "PIPELINE_REDIS__URL": server.url,
            "PIPELINE_REDIS__KEY_PREFIX": prefix,
            "PIPELINE_TOPICS_DIR": str(tmp_path / "topics"),
            "PIPELINE_MEMBERSHIP__SLOT_DIR": str(tmp_path / "slots"),
            "PIPELINE_RUNTIME__METRICS_HOST": "127.0.0.1",
            "PIPELINE_RUNTIME__METRICS_PORT": str(metrics_port),
        }
        proc = await consume(tmp_path, f"{name}:app", group, env)
        assert proc.stderr is not None
        lines: list[str] = []
        try:
            line = await next_line(proc.stderr, lines, "holds no state-loss marker")
            await next_line(proc.stderr, lines, "consuming as group")
            await lost_count(metrics_port, group, 1.0)
            proc.send_signal(signal.SIGTERM)
            _, rest = await asyncio.wait_for(proc.communicate(), 60)
            lines += rest.decode().splitlines(keepends=True)
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    assert proc.returncode == 0, "".join(lines)
    assert "CRITICAL" in line
    assert f"although group {group} has" in line
    assert server.url in line
    assert len([x for x in lines if "holds no state-loss marker" in x]) == 1, "".join(lines)
