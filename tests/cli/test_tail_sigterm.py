"""`pipeline tail` stopped by SIGTERM ends with one line and exit 143, leaving nothing behind."""

from __future__ import annotations

import os
import re
import signal

import pytest
from redis.asyncio import Redis
from support import delete_group_after_test, reader_groups_of, signalled_tail

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
        code, stderr = await signalled_tail(topic, transport_name, env, signal.SIGTERM, 30)
        said = stderr.decode(errors="replace")
        assert code == 143, said
        assert "Traceback" not in said, said
        lines = [line for line in said.splitlines() if "stopped by SIGTERM" in line]
        assert lines == [f"error: tail of {topic} stopped by SIGTERM after 1 message"], said
        if transport_name == "kafka":
            assert await reader_groups_of(settings, client_id, stderr) == set()
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
