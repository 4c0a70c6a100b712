"""Transports: the one interface every stage uses to reach Kafka or Redis Streams."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pipeline.config import Settings
    from pipeline.transport.protocol import Transport


def create_transport(settings: Settings, name: str | None = None) -> Transport:
    """The transport named by ``name`` or ``settings.transport`` (``kafka`` or ``redis``)."""
    chosen = name or settings.transport
    if chosen == "kafka":
        from pipeline.transport.kafka import KafkaTransport  # noqa: PLC0415 - import on demand

        return KafkaTransport(settings)
    if chosen == "redis":
        from pipeline.transport.redis_streams import RedisStreamsTransport  # noqa: PLC0415

        return RedisStreamsTransport(settings)
    raise ValueError(f"unknown transport {chosen!r}: expected 'kafka' or 'redis'")
