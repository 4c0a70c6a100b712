"""A fixture body for tests that declare lanes: the topics and the group are deleted after."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

from runtime.helpers import declare

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
