"""`pipeline tail` of an entry whose time no calendar holds prints it, not a traceback.

On Redis Streams an entry's time is its ``t`` field, which another client's raw ``XADD`` may set
to any number of up to 19 digits: one past the year 9999 stopped ``tail`` (text and ``--json``)
with an OverflowError traceback at that entry.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys

import pytest
from redis.asyncio import Redis

from pipeline.config import Settings
from pipeline.transport import create_transport
from pipeline.transport.protocol import TopicConfig
from pipeline.transport.redis_streams.keys import Keys

pytestmark = pytest.mark.redis

FAR = 9_999_999_999_999_999
"""Milliseconds since the epoch: about the year 316,889,355."""


async def _tail(topic: str, *extra: str) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "pipeline",
        "tail",
        topic,
        "--from-beginning",
        "--limit",
        "1",
        "-t",
        "redis",
        *extra,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=dict(os.environ),
    )
    out, err = await asyncio.wait_for(process.communicate(), 60)
    return process.returncode or 0, out.decode(), err.decode()


async def test_an_entry_of_no_calendar_date_is_printed_with_its_number(
    settings: Settings, redis_service: str, redis: Redis, unique: str
) -> None:
    """Text: ``at N ms`` in the time's place; JSON: ``timestamp`` null, ``timestamp_ms`` N."""
    topic = f"tailfar_{unique}"
    transport = create_transport(settings, "redis")
    admin = transport.admin()
    await admin.create_topic(TopicConfig(topic, 1))
    try:
        stream = Keys(settings.redis.key_prefix).stream(topic, 0)
        await redis.xadd(stream, {"k": b"key", "v": b"far value", "t": str(FAR)})
        code, out, err = await _tail(topic)
        assert code == 0, err
        assert "Traceback" not in err
        assert f"at {FAR} ms" in out
        assert "far value" in out
        code, out, err = await _tail(topic, "--json")
        assert code == 0, err
        shown = json.loads(out.splitlines()[0])
        assert shown["timestamp"] is None
        assert shown["timestamp_ms"] == FAR
    finally:
        await admin.delete_topic(topic)
        await transport.close()
