"""Fixtures for tests that declare lanes and use keys of their own: all deleted after.

``prefix`` and ``lanes`` are shared by the runtime and the cancellation suites (each conftest
imports them).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from redis.asyncio import Redis
from runtime.helpers import declare

from pipeline.cancel.keys import CancelKeys
from pipeline.errors import PipelineError
from pipeline.topics.spec import TopicSpec
from pipeline.transport.protocol import Transport

Declare = Callable[..., Awaitable[None]]


async def owned_lanes(transport: Transport, group: str) -> AsyncIterator[Declare]:
    """Yield a ``declare(*specs)`` that creates the lanes; delete them and ``group`` after."""
    specs: list[TopicSpec] = []

    async def declare_owned(*more: TopicSpec) -> None:
        specs.extend(more)
        await declare(transport, *more)

    yield declare_owned
    admin = transport.admin()
    topics = [topic for spec in specs for topic in spec.topic_names()]
    with contextlib.suppress(PipelineError):
        await admin.delete_group(group, topics)
    for topic in topics:
        with contextlib.suppress(PipelineError):
            await admin.delete_topic(topic)


@pytest.fixture
async def prefix(redis: Redis, unique: str) -> AsyncIterator[str]:
    """A key prefix of the test's own; its cancellation and guard keys are deleted after."""
    name = f"t{unique}"
    yield name
    left = [k async for k in redis.scan_iter(f"{{{name}:*")]
    await redis.delete(*CancelKeys(name).all(), *left)


@pytest.fixture
async def lanes(transport: Transport, unique: str) -> AsyncIterator[Declare]:
    """Declare lanes for the test; their topics and its group are deleted after."""
    async for declare_owned in owned_lanes(transport, f"g-{unique}"):
        yield declare_owned
