"""The in-memory :class:`~pipeline.transport.protocol.Transport`."""

from __future__ import annotations

from collections.abc import Sequence

from pipeline.testing.memory.admin import MemoryAdmin
from pipeline.testing.memory.broker import MemoryBroker
from pipeline.testing.memory.consumer import MemoryConsumer
from pipeline.testing.memory.producer import MemoryProducer
from pipeline.transport.group_reader import GroupReader
from pipeline.transport.protocol import RebalanceListener, StartAt

DEFAULT_MAX_MESSAGE_BYTES = 1_114_112
"""The same default as ``PIPELINE_MAX_MESSAGE_BYTES``: 1 MiB payloads plus key and headers."""


class MemoryTransport:
    """A broker in this process: same partitioning, groups and delivery rules as the real ones.

    Transports made with the same ``broker`` share its topics and groups, as clients of one
    Kafka cluster do. It passes the transport contract suite (``tests/contract/``).
    """

    name = "memory"

    def __init__(
        self,
        broker: MemoryBroker | None = None,
        *,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    ) -> None:
        """Use ``broker`` (default: a new, empty one)."""
        self.broker = broker if broker is not None else MemoryBroker()
        self._max_message_bytes = max_message_bytes
        self.producers: list[MemoryProducer] = []
        """Every producer this transport made (their ``sent`` lists record what was sent)."""

    def producer(self) -> MemoryProducer:
        """A new producer."""
        producer = MemoryProducer(self.broker, self._max_message_bytes)
        self.producers.append(producer)
        return producer

    def consumer(
        self,
        group: str,
        topics: Sequence[str],
        *,
        listener: RebalanceListener | None = None,
        member_id: str | None = None,
        start_at: StartAt = "earliest",
    ) -> MemoryConsumer:
        """A new member of ``group`` subscribed to ``topics``."""
        return MemoryConsumer(
            self.broker, group, topics, listener=listener, member_id=member_id, start_at=start_at
        )

    def reader(self, topics: Sequence[str], *, start_at: StartAt = "earliest") -> GroupReader:
        """A new reader of ``topics``: a member of a group of its own that never commits."""
        return GroupReader(
            lambda group, start: self.consumer(group, topics, member_id=group, start_at=start),
            self.admin,
            topics,
            start_at=start_at,
        )

    def admin(self) -> MemoryAdmin:
        """A new admin client."""
        return MemoryAdmin(self.broker)

    async def close(self) -> None:
        """Nothing to release: the broker lives as long as something refers to it."""
