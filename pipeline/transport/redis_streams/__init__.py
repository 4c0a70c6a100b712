"""Redis Streams transport on redis-py (asyncio, hiredis)."""

from pipeline.transport.redis_streams.transport import RedisStreamsTransport

__all__ = ["RedisStreamsTransport"]
