"""The Redis Streams producer's drain: whatever ends a batch's call, every waiting send hears of it.

Sends queue up and go out together; the caller of each waits on its run's future. A failure of
the batch's call that is no redis-py error (an ``OSError`` the client let through, a bug) must
reach those callers instead of leaving them waiting forever.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest
from support import delete_after_test

from pipeline.config import Settings
from pipeline.errors import BrokerUnavailable
from pipeline.transport.protocol import TopicConfig
from pipeline.transport.redis_streams.functions import Functions
from pipeline.transport.redis_streams.keys import Keys
from pipeline.transport.redis_streams.producer import RedisStreamsProducer
from pipeline.transport.redis_streams.transport import RedisStreamsTransport

pytestmark = pytest.mark.usefixtures("redis_service")

HANG_GUARD_S = 30.0
"""Far longer than a produce takes: reaching it means a send was left waiting."""


class _FailingOnce(Functions):
    """The real library, whose first batch call fails with ``error`` before reaching Redis."""

    def __init__(self, functions: Functions, error: Exception) -> None:
        super().__init__(functions.client)
        self.error: Exception | None = error

    async def produce_batch(
        self, calls: Sequence[tuple[Sequence[str], Sequence[Any]]]
    ) -> list[Any]:
        error, self.error = self.error, None
        if error is not None:
            raise error
        return await super().produce_batch(calls)


@pytest.fixture
async def transport(settings: Settings) -> AsyncIterator[RedisStreamsTransport]:
    """A Redis Streams transport on the shared Redis."""
    t = RedisStreamsTransport(settings)
    yield t
    await t.close()


@pytest.mark.parametrize(
    ("error", "raised"),
    [
        (ConnectionResetError(104, "Connection reset by peer"), BrokerUnavailable),
        (RuntimeError("a bug in the batch"), RuntimeError),
    ],
)
async def test_a_batch_failing_with_no_redis_error_fails_its_sends(
    transport: RedisStreamsTransport,
    unique: str,
    error: Exception,
    raised: type[Exception],
) -> None:
    """Every send of a batch whose call raised something else than a redis-py error raises."""
    topic = f"drain-{unique}"
    delete_after_test(transport, [topic])
    await transport.admin().create_topic(TopicConfig(topic, 2))
    producer = RedisStreamsProducer(
        transport.client,
        Keys(transport._settings.redis.key_prefix),
        _FailingOnce(transport._functions, error),
        transport._settings.max_message_bytes,
        transport._settings.redis.max_len,
    )
    sends = [producer.send(topic, b"v%d" % i, partition=i % 2) for i in range(4)]
    outcomes = await asyncio.wait_for(asyncio.gather(*sends, return_exceptions=True), HANG_GUARD_S)
    assert all(isinstance(o, raised) for o in outcomes), outcomes
    assert str(error) in str(outcomes[0])

    # The producer goes on: the next send is acknowledged.
    delivered = await asyncio.wait_for(producer.send(topic, b"after", partition=0), HANG_GUARD_S)
    assert delivered.topic == topic
    await producer.close()
