"""`pipeline tail` stopped or killed leaves nothing on the broker (Redis streams, Kafka groups)."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys
import time

import pytest
from redis.asyncio import Redis
from support import delete_group_after_test, reader_groups_of, signalled_tail

from pipeline.config import Settings
from pipeline.transport import create_transport
from pipeline.transport.protocol import TopicConfig


async def test_a_killed_tail_leaves_no_group_on_the_streams(
    settings: Settings, redis: Redis, unique: str
) -> None:
    """A tail killed (SIGKILL) while it reads leaves no consumer group on the topic's streams."""
    topic = f"tail_{unique}"
    transport = create_transport(settings, "redis")
    admin = transport.admin()
    await admin.create_topic(TopicConfig(topic, 2))
    try:
        producer = transport.producer()
        await producer.send(topic, b"one", key=b"k")
        await producer.close()
        name = f"tail-{unique}"
        env = {**os.environ, "PIPELINE_REDIS__URL": f"{settings.redis.url}?client_name={name}"}
        command = [sys.executable, "-m", "pipeline", "tail", topic, "--from-beginning"]
        pipe = asyncio.subprocess.PIPE
        tail = await asyncio.create_subprocess_exec(
            *command, "-t", "redis", env=env, stdout=pipe, stderr=pipe
        )
        try:
            deadline = time.monotonic() + 60
            while not any(  # killed once it waits for more messages
                c.get("name") == name and c.get("cmd") in ("xread", "xreadgroup")
                for c in await redis.client_list()
            ):
                assert tail.returncode is None, await tail.communicate()
                assert time.monotonic() < deadline, "the tail read nothing in 60 s"
                await asyncio.sleep(0.01)
        finally:
            tail.kill()
            await asyncio.wait_for(tail.communicate(), 60)
        streams = [f"{{{settings.redis.key_prefix}:{topic}:{p}}}:s" for p in range(2)]
        held = [s for s in streams if await redis.exists(s)]
        assert [g["name"] for s in held for g in await redis.xinfo_groups(s)] == []
    finally:
        await admin.delete_topic(topic)
        await transport.close()


_STOPPED = {signal.SIGINT: 130, signal.SIGKILL: -signal.SIGKILL}
"""How a tail stopped by each signal exits: Ctrl-C is a clean stop (exit 130), SIGKILL kills.
SIGTERM, a clean stop with its line, on both transports: test_tail_sigterm.py."""


@pytest.mark.parametrize("stop", list(_STOPPED), ids=lambda s: signal.Signals(s).name)
async def test_a_stopped_kafka_tail_ends_at_once_and_leaves_no_group(
    settings: Settings, kafka_service: str, unique: str, stop: signal.Signals
) -> None:
    """A Kafka tail stopped by Ctrl-C or SIGKILL once it printed ends, leaving no group."""
    topic = f"tail_{unique}"
    transport = create_transport(settings, "kafka")
    admin = transport.admin()
    await admin.create_topic(TopicConfig(topic, 2))
    stderr = b""
    try:
        producer = transport.producer()
        await producer.send(topic, b"one", key=b"k")
        await producer.close()
        client_id = f"tail-{unique}"
        env = {
            **os.environ,
            "PIPELINE_LOG_LEVEL": "INFO",  # a member logs its group's name
            "PIPELINE_KAFKA__CLIENT_ID": client_id,
            "PIPELINE_KAFKA__SESSION_TIMEOUT_MS": "6000",  # the broker's least
        }
        code, stderr = await signalled_tail(topic, "kafka", env, stop, within_s=10)
        assert code == _STOPPED[stop], stderr.decode(errors="replace")
        assert await reader_groups_of(settings, client_id, stderr) == set()
    finally:
        for group in set(re.findall(rb"pipeline-reader-\w+", stderr)):
            delete_group_after_test(settings, "kafka", group.decode(), [topic])
        await admin.delete_topic(topic)
        await transport.close()
