"""The in-memory :class:`~pipeline.transport.protocol.Admin`."""

from __future__ import annotations

from collections.abc import Collection, Sequence

from pipeline.envelope import TopicPartition
from pipeline.errors import TransportError
from pipeline.testing.memory.broker import Entry, MemoryBroker, Topic
from pipeline.transport.protocol import PartitionLag, TopicConfig, TopicInfo


class MemoryAdmin:
    """Creates and inspects the topics and groups of a :class:`MemoryBroker`."""

    def __init__(self, broker: MemoryBroker) -> None:
        """Administer ``broker``."""
        self._broker = broker

    async def list_topics(self, names: Collection[str] | None = None) -> dict[str, TopicInfo]:
        """Every topic (or those of ``names`` that exist) with its message counts."""
        self._broker.check("list topics")
        chosen = self._broker.topics if names is None else set(names) & set(self._broker.topics)
        out = {}
        for name in sorted(chosen):
            topic = self._broker.topics[name]
            counts = tuple(len(p) for p in topic.partitions)
            out[name] = TopicInfo(name, len(topic.partitions), topic.retention_ms, counts)
        return out

    async def create_topic(self, config: TopicConfig) -> None:
        """Create the topic; raises TransportError if it exists."""
        self._broker.check(f"create topic {config.name!r}")
        if config.name in self._broker.topics:
            raise TransportError(f"create topic {config.name!r}: topic already exists")
        partitions: list[list[Entry]] = [[] for _ in range(config.partitions)]
        self._broker.topics[config.name] = Topic(config.name, partitions, config.retention_ms)
        self._broker.changed()

    async def update_topic(self, config: TopicConfig) -> None:
        """Grow partitions and set retention; raises TransportError for fewer partitions."""
        self._broker.check(f"update topic {config.name!r}")
        topic = self._broker.topic(config.name)
        if config.partitions < len(topic.partitions):
            raise TransportError(
                f"topic {config.name!r} has {len(topic.partitions)} partitions; "
                f"it cannot shrink to {config.partitions}"
            )
        while len(topic.partitions) < config.partitions:
            topic.partitions.append([])
        if config.retention_ms is not None:
            topic.retention_ms = config.retention_ms
        self._broker.changed()

    async def delete_topic(self, name: str) -> None:
        """Delete the topic, its messages and what every group recorded on it.

        As Kafka forgets a deleted topic's offsets: a topic created again under the name starts
        at offset 0, and a group keeping the old positions would skip its first messages.
        A topic that does not exist raises :class:`~pipeline.errors.UnknownTopic`, as on the
        brokers.
        """
        self._broker.check(f"delete topic {name!r}")
        self._broker.topic(name)
        del self._broker.topics[name]
        for group in self._broker.groups:
            self._broker.forget_topics(group, (name,))
        self._broker.changed()

    async def group_lag(self, group: str, topic: str) -> list[PartitionLag]:
        """Committed position, end and oldest unconsumed timestamp of each partition."""
        self._broker.check(f"group lag of {group!r}")
        state = self._broker.groups.get(group)
        out = []
        for p, log in enumerate(self._broker.topic(topic).partitions):
            tp = TopicPartition(topic, p)
            position = state.committed.get(tp) if state is not None else None
            committed = position.offset if position is not None else None
            first = committed or 0
            oldest = log[first].timestamp_ms if first < len(log) else None
            out.append(PartitionLag(tp, committed, len(log), oldest, 0))
        return out

    async def delete_group(self, group: str, topics: Sequence[str]) -> None:
        """Forget the group's positions and delivery counts on ``topics``."""
        self._broker.check(f"delete group {group!r}")
        self._broker.forget_topics(group, set(topics))

    async def close(self) -> None:
        """Nothing to release."""
