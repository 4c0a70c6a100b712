"""`pipeline tail` killed on Redis Streams leaves nothing on the topic's streams."""

from __future__ import annotations

import asyncio
import os
import sys
import time

from redis.asyncio import Redis

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
