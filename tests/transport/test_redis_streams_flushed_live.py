"""`pipeline consume` on Redis Streams whose Redis is flushed under it says what was lost.

A FLUSHALL under a running member took its topics, their messages and its group's positions:
its blocked read failed (``UNBLOCKED``: a warning, "poll failed, retrying"), the next found no
group and no topic, and the member ended with ``topic '...' does not exist (declare it in
topics/ and run `pipeline topics apply`)``: a line for a topic never declared, not for a Redis
that lost its data, and before its state watch (one look every 5 s) said so. It now ends with
one line naming the loss, what went with it and what to do.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from redis.asyncio import Redis
from runtime.helpers import consuming, logged_until, write_idle_app
from runtime.private_redis import bare_client, bare_redis
from support import run_pipeline

from pipeline.config import Settings
from pipeline.errors import UnknownTopic
from pipeline.transport import create_transport
from pipeline.transport.protocol import TopicConfig, Transport
from pipeline.transport.redis_streams.keys import Keys


async def test_a_flush_under_a_member_ends_it_with_one_line_naming_the_loss(
    tmp_path: Path, unique: str
) -> None:
    """FLUSHALL while it consumes: exit 1 with one line naming the loss and the fix."""
    name, group, prefix = f"fl_{unique}", f"g-{unique}", f"t{unique}"
    write_idle_app(tmp_path, name)
    with bare_redis() as server:
        env = {
            **os.environ,
            "PIPELINE_TRANSPORT": "redis",
            "PIPELINE_REDIS__URL": server.url,
            "PIPELINE_REDIS__KEY_PREFIX": prefix,
            "PIPELINE_TOPICS_DIR": str(tmp_path / "topics"),
            "PIPELINE_MEMBERSHIP__SLOT_DIR": str(tmp_path / "slots"),
        }
        applied = await asyncio.to_thread(run_pipeline, "topics", "apply", env=env, cwd=tmp_path)
        assert applied.returncode == 0, applied.stderr
        lines: list[str] = []
        client = Redis.from_url(server.url)
        try:
            async with consuming(tmp_path, f"{name}:app", group, env) as proc:
                await logged_until(proc, lines, "consuming as group")
                assert await client.exists(Keys(prefix).topics) == 1
                await client.flushall()
                _, rest = await asyncio.wait_for(proc.communicate(), 60)
                lines += rest.decode().splitlines(keepends=True)
        finally:
            await client.aclose()
    log = "".join(lines)
    assert proc.returncode == 1, log
    assert "poll failed" not in log, log
    assert "Traceback" not in log, log
    (line,) = [x for x in lines if x.startswith("error: ")]
    assert "lost its data" in line, log
    (said,) = [x for x in lines if " CRITICAL " in x]
    assert "lost its data (marker" in said, log
    assert lines.index(said) < lines.index(line), log  # the watch's line comes before the exit
    assert f"Redis {server.url}" in line
    assert f"{name}, {name}.retry.1s" in line  # the topics the member read
    assert f"{prefix}:topics is gone" in line
    assert f"group {group}'s positions" in line
    assert "pipeline topics apply" in line
    assert "docs/operations.md#redis-or-kafka-outage" in line
    assert "appendonly yes" in line


@asynccontextmanager
async def blocked_member(
    settings: Settings, unique: str
) -> AsyncIterator[tuple[Redis, Transport, asyncio.Task[object]]]:
    """On a private Redis, topics A and B, and a member of A whose next read is blocked.

    Yields a client of that Redis, the transport and the polling task (its read blocked).
    """
    async with bare_client() as (server, client):
        redis = settings.redis.model_copy(update={"url": server.url, "key_prefix": f"t{unique}"})
        transport = create_transport(settings.model_copy(update={"redis": redis}), "redis")
        consumer = transport.consumer(f"g-{unique}", [f"a_{unique}"])
        try:
            for name in (f"a_{unique}", f"b_{unique}"):
                await transport.admin().create_topic(TopicConfig(name, 1))
            while not consumer.assignment():
                await consumer.poll(10, 0.1)
            polling = asyncio.ensure_future(consumer.poll(10, 30))
            while int((await client.info("clients"))["blocked_clients"]) < 1:
                assert not polling.done(), polling
            yield client, transport, polling
        finally:
            await consumer.close()
            await transport.close()


async def test_a_topic_deleted_under_a_blocked_read_is_unknown_as_before(
    settings: Settings, unique: str
) -> None:
    """The other topics are there: the topic was deleted, and the line asks to declare it."""
    async with blocked_member(settings, unique) as (_, transport, polling):
        await transport.admin().delete_topic(f"a_{unique}")
        with pytest.raises(UnknownTopic, match=f"topic 'a_{unique}' does not exist"):
            await polling


async def test_a_flush_under_a_blocked_read_is_named_a_loss(
    settings: Settings, unique: str
) -> None:
    """No topic left under the prefix: the line names the loss, not an undeclared topic."""
    async with blocked_member(settings, unique) as (client, _, polling):
        await client.flushall()
        with pytest.raises(UnknownTopic, match="that Redis lost its data") as raised:
            await polling
    assert f"topics a_{unique} are gone" in str(raised.value)
    assert f"group g-{unique}'s positions" in str(raised.value)
