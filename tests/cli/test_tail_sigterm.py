"""`pipeline tail` stopped by SIGTERM ends with one line and exit 143, leaving nothing behind."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys

import pytest
from confluent_kafka.admin import AdminClient
from redis.asyncio import Redis
from support import delete_group_after_test

from pipeline.config import Settings
from pipeline.transport import create_transport
from pipeline.transport.protocol import TopicConfig


@pytest.mark.parametrize("transport_name", ["kafka", "redis"])
async def test_a_tail_stopped_by_sigterm_says_so_and_leaves_nothing(
    settings: Settings,
    redis: Redis,
    unique: str,
    transport_name: str,
    request: pytest.FixtureRequest,
) -> None:
    """SIGTERM once the tail printed a message: exit 143, one stderr line, no group left."""
    if transport_name == "kafka":
        request.getfixturevalue("kafka_service")  # skips when the broker does not answer
    topic = f"tail_{unique}"
    transport = create_transport(settings, transport_name)
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
            "PIPELINE_LOG_LEVEL": "INFO",
            "PIPELINE_KAFKA__CLIENT_ID": client_id,
        }
        command = [sys.executable, "-m", "pipeline", "tail", topic, "--from-beginning"]
        pipe = asyncio.subprocess.PIPE
        tail = await asyncio.create_subprocess_exec(
            *command, "-t", transport_name, env=env, stdout=pipe, stderr=pipe
        )
        assert tail.stdout is not None
        try:
            printed = await asyncio.wait_for(tail.stdout.readline(), 60)
            assert printed.startswith(f"{topic}[".encode()), await tail.communicate()
            tail.send_signal(signal.SIGTERM)
            _, stderr = await asyncio.wait_for(tail.communicate(), 30)  # a hang fails here
        finally:
            if tail.returncode is None:
                tail.kill()
                _, stderr = await tail.communicate()
        said = stderr.decode(errors="replace")
        assert tail.returncode == 143, said
        assert "Traceback" not in said, said
        lines = [line for line in said.splitlines() if "stopped by SIGTERM" in line]
        assert lines == [f"error: tail of {topic} stopped by SIGTERM after 1 message"], said
        if transport_name == "kafka":
            assert await _kafka_groups_of(settings, client_id, stderr) == set()
        else:
            streams = [f"{{{settings.redis.key_prefix}:{topic}:{p}}}:s" for p in range(2)]
            held = [s for s in streams if await redis.exists(s)]
            assert held  # the message sent is there
            assert [g["name"] for s in held for g in await redis.xinfo_groups(s)] == []
    finally:
        for group in set(re.findall(rb"pipeline-reader-\w+", stderr)):
            delete_group_after_test(settings, "kafka", group.decode(), [topic])
        await admin.delete_topic(topic)
        await transport.close()


async def _kafka_groups_of(settings: Settings, client_id: str, stderr: bytes) -> set[str]:
    """The groups on the broker a tail of ``client_id`` joined (named in its log or not)."""
    named = {g.decode() for g in re.findall(rb"pipeline-reader-\w+", stderr)}
    client = AdminClient({"bootstrap.servers": settings.kafka.bootstrap_servers})
    listed = await asyncio.to_thread(
        lambda: client.list_consumer_groups(request_timeout=10).result()
    )
    readers = [g.group_id for g in listed.valid if g.group_id.startswith("pipeline-reader-")]
    if not readers:
        return set()
    described = client.describe_consumer_groups(readers, request_timeout=10)
    joined = set()
    for group, future in described.items():
        members = (await asyncio.wrap_future(future)).members
        if group in named or any(m.client_id.startswith(f"{client_id}-") for m in members):
            joined.add(group)
    return joined
