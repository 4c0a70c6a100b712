"""Helpers for the offload tests: an offloading lane on a real broker, a port nothing serves."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from redis.asyncio import Redis
from runtime.helpers import declare, lane_spec

from pipeline.topics.spec import TopicSpec
from pipeline.transport.protocol import Transport


def offload_lane(name: str, store_url: str | None, **fields: Any) -> TopicSpec:
    """A lane with one 200 ms retry tier, two attempts, and (with a store) ``offload:``."""
    extra = {"offload": {"above": "256KiB", "store": store_url}} if store_url else {}
    return lane_spec(name, 2, retry={"tiers": ["200ms"], "max_attempts": 2}, **extra, **fields)


@asynccontextmanager
async def declared(
    transport: Transport, redis: Redis, prefix: str, *specs: TopicSpec
) -> AsyncIterator[None]:
    """Declare ``specs`` on the broker; delete their topics and the ``prefix`` Redis keys after."""
    await declare(transport, *specs)
    try:
        yield
    finally:
        admin = transport.admin()
        for spec in specs:
            for topic in spec.topic_names():
                await admin.delete_topic(topic)
        keys = [key async for key in redis.scan_iter(match=f"*{prefix}*")]
        if keys:
            await redis.delete(*keys)


def closed_port() -> int:
    """A loopback port nothing listens on."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])
