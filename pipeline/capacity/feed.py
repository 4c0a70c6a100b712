"""What a producing process adds to record arrivals and export the plan: one object, three calls.

The ingress (or any producer) builds a :class:`CapacityFeed` from the settings, wraps its
producer with :meth:`CapacityFeed.wrap` (one counter add per acknowledged batch, flushed to
Redis every ``CAPACITY__FLUSH_INTERVAL_S``), adds :meth:`CapacityFeed.source` to its
``/metrics`` sources, and calls :meth:`CapacityFeed.close` on the way out. A consumer-group
member adds :meth:`CapacityFeed.service_source` to its sources instead, so the lanes' service
times are measured.
"""

from __future__ import annotations

from collections.abc import Sequence

from redis.asyncio import Redis

from pipeline.capacity.history import ArrivalHistory
from pipeline.capacity.recorder import ArrivalRecorder, CountingProducer
from pipeline.capacity.settings import check_service_lanes
from pipeline.capacity.source import CapacitySource, ServiceTimeSource
from pipeline.config import Settings
from pipeline.observability.facades import CapacityMetrics
from pipeline.observability.metrics import Metrics
from pipeline.topics.spec import TopicSpec
from pipeline.transport.protocol import Producer

__all__ = ["CapacityFeed"]


class CapacityFeed:
    """The arrival recorder and the capacity source of one process."""

    def __init__(self, settings: Settings, specs: Sequence[TopicSpec]) -> None:
        """Connect lazily to ``settings.redis`` for the lanes of ``specs``."""
        self._settings = settings
        self._lanes = {spec.name: spec.lane for spec in specs}
        self._client = Redis.from_url(
            settings.redis.url,
            socket_timeout=settings.redis.socket_timeout_s,
            socket_connect_timeout=settings.redis.socket_timeout_s,
        )
        self.history = ArrivalHistory(
            self._client,
            settings.redis.key_prefix,
            retention_days=settings.capacity.retention_days,
        )
        self.recorder = ArrivalRecorder(
            self.history, flush_interval_s=settings.capacity.flush_interval_s
        )

    def wrap(self, producer: Producer) -> Producer:
        """``producer``, counting what it produces to the lanes' main topics; starts the timer."""
        self.recorder.start()
        return CountingProducer(producer, self.recorder, self._lanes)

    def source(self, metrics: Metrics) -> CapacitySource:
        """The ``/metrics`` source of every lane's forecast and desired members.

        The lanes are those of every declared topic (the ingress's): a ``SERVICE_S`` entry for
        any other lane is a ConfigError (:func:`~pipeline.capacity.settings.check_service_lanes`).
        """
        capacity = self._settings.capacity
        lanes = sorted(set(self._lanes.values()))
        check_service_lanes(capacity, lanes, self._settings.topics_dir)
        return CapacitySource(
            self.history,
            lanes,
            capacity,
            CapacityMetrics(metrics),
            slots_per_member=capacity.slots_per_member or self._settings.runtime.max_concurrency,
        )

    def service_source(self, metrics: Metrics) -> ServiceTimeSource:
        """For a member: its handled durations become the lanes' measured service time."""
        return ServiceTimeSource(metrics, self.recorder, sorted(set(self._lanes.values())))

    async def close(self) -> None:
        """Flush the last counts and close the Redis connection."""
        try:
            await self.recorder.close()
        finally:
            await self._client.aclose()
