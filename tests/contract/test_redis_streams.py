"""The contract suites against Redis Streams, a real server."""

from __future__ import annotations

from contract.base.transport import TransportContract


class TestRedisStreamsTransport(TransportContract):
    """RedisStreamsTransport passes the transport contract."""

    kind = "redis"
