"""The Redis Streams :class:`~pipeline.transport.protocol.Transport`."""

from __future__ import annotations

from collections.abc import Sequence

from redis.asyncio import Redis

from pipeline.config import Settings
from pipeline.redis_channel import open_channel
from pipeline.transport.protocol import RebalanceListener, StartAt
from pipeline.transport.redis_streams.admin import RedisStreamsAdmin
from pipeline.transport.redis_streams.consumer import RedisStreamsConsumer
from pipeline.transport.redis_streams.functions import Functions
from pipeline.transport.redis_streams.keys import Keys
from pipeline.transport.redis_streams.packing import pack_in_one_pass
from pipeline.transport.redis_streams.producer import RedisStreamsProducer
from pipeline.transport.redis_streams.reader import RedisStreamsReader


class RedisStreamsTransport:
    """Redis Streams: a topic is N streams (its partitions), keyed with Java-compatible murmur2."""

    name = "redis"

    def __init__(self, settings: Settings) -> None:
        """Create the shared client (connections open lazily)."""
        self._settings = settings
        self._keys = Keys(settings.redis.key_prefix)
        self.client: Redis = Redis.from_url(
            settings.redis.url,
            socket_timeout=settings.redis.socket_timeout_s,
            socket_connect_timeout=settings.redis.socket_timeout_s,
            decode_responses=False,
        )
        pack_in_one_pass(self.client.connection_pool)
        # Function calls (produce above all) on one pipelined connection of their own where the
        # client is plain TCP (pipeline/redis_channel.py); TLS and sockets keep redis-py's path.
        self._channel = open_channel(self.client)
        self._functions = Functions(self.client)

    def producer(self) -> RedisStreamsProducer:
        """A new producer."""
        return RedisStreamsProducer(
            self.client,
            self._keys,
            self._functions,
            self._settings.max_message_bytes,
            self._settings.redis.max_len,
        )

    def consumer(
        self,
        group: str,
        topics: Sequence[str],
        *,
        listener: RebalanceListener | None = None,
        member_id: str | None = None,
        start_at: StartAt = "earliest",
    ) -> RedisStreamsConsumer:
        """A new member of ``group``, named after the configured instance when it has one.

        A named member keeps its partitions' leases on close when ``membership.shutdown`` is
        ``hold``, so its replacement (same name) takes them back; an explicit ``member_id``
        (tools such as ``pipeline tail``) always leaves.
        """
        membership = self._settings.membership
        named = member_id is None and membership.instance is not None
        return RedisStreamsConsumer(
            self.client,
            self._keys,
            self._functions,
            self._settings.redis,
            group,
            topics,
            listener=listener,
            member_id=member_id or membership.instance,
            start_at=start_at,
            hold_on_close=named and membership.shutdown == "hold",
        )

    def reader(
        self, topics: Sequence[str], *, start_at: StartAt = "earliest"
    ) -> RedisStreamsReader:
        """A new reader of ``topics`` in no consumer group (``XREAD``): it leaves nothing behind."""
        return RedisStreamsReader(
            self.client, self._keys, self._settings.redis, topics, start_at=start_at
        )

    def admin(self) -> RedisStreamsAdmin:
        """A new admin client."""
        return RedisStreamsAdmin(self.client, self._keys, self._settings.redis.max_len)

    async def close(self) -> None:
        """Close the function channel and the shared connection pool."""
        if self._channel is not None:
            await self._channel.aclose()
        await self.client.aclose()
