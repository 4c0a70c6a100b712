"""The Kafka :class:`~pipeline.transport.protocol.Transport`: factory of producers and members."""

from __future__ import annotations

from collections.abc import Sequence

from pipeline.config import Settings
from pipeline.transport.kafka.admin import KafkaAdmin
from pipeline.transport.kafka.consumer import KafkaConsumer
from pipeline.transport.kafka.producer import KafkaProducer
from pipeline.transport.kafka.reader import KafkaReader
from pipeline.transport.protocol import RebalanceListener, StartAt


class KafkaTransport:
    """Apache Kafka through confluent-kafka (librdkafka)."""

    name = "kafka"

    def __init__(self, settings: Settings) -> None:
        """Keep the settings; clients are created on demand."""
        self._settings = settings

    def producer(self) -> KafkaProducer:
        """A new idempotent producer."""
        return KafkaProducer(self._settings.kafka, self._settings.max_message_bytes)

    def consumer(
        self,
        group: str,
        topics: Sequence[str],
        *,
        listener: RebalanceListener | None = None,
        member_id: str | None = None,
        start_at: StartAt = "earliest",
    ) -> KafkaConsumer:
        """A new member of ``group``."""
        membership = self._settings.membership
        # Static membership needs a member that keeps its slot on shutdown: a static member
        # cannot leave its group at once, so ``leave`` makes it a dynamic one.
        static = membership.instance if membership.shutdown == "hold" else None
        return KafkaConsumer(
            self._settings.kafka,
            group,
            topics,
            listener=listener,
            member_id=member_id or membership.instance,
            instance=static if member_id is None else None,
            start_at=start_at,
        )

    def reader(self, topics: Sequence[str], *, start_at: StartAt = "earliest") -> KafkaReader:
        """A new reader of ``topics``: their partitions assigned to a consumer in no group."""
        return KafkaReader(self._settings.kafka, topics, start_at=start_at)

    def admin(self) -> KafkaAdmin:
        """A new admin client."""
        return KafkaAdmin(self._settings.kafka)

    async def close(self) -> None:
        """Nothing shared to release."""
