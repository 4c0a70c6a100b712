"""The transport interface every stage talks to, and the value types it exchanges.

Two implementations exist, with the same file names in each package: ``transport/kafka/``
(confluent-kafka) and ``transport/redis_streams/`` (redis-py). Both

* map a key to a partition with Java-compatible murmur2 (:mod:`pipeline.transport.partitioner`);
* keep per-partition order and give each partition to one group member at a time;
* deliver at least once: a message is redelivered until a commit covers it;
* translate client-library errors into :mod:`pipeline.errors` at the boundary.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

from pipeline.envelope import Delivered, Message, Position, Record, TopicPartition


@dataclass(frozen=True, slots=True)
class TopicConfig:
    """What a broker needs to create or update one topic.

    Attributes:
        name: topic name.
        partitions: partition count (never decreased by an update).
        retention_ms: how long messages are kept (Kafka ``retention.ms``); None keeps the default.
        max_len: Redis Streams only: approximate number of entries kept per partition stream.
        configs: further broker configs (Kafka topic configs such as ``cleanup.policy``).
    """

    name: str
    partitions: int
    retention_ms: int | None = None
    max_len: int | None = None
    configs: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class TopicInfo:
    """A topic as the broker has it."""

    name: str
    partitions: int
    retention_ms: int | None
    message_counts: tuple[int, ...]
    max_message_bytes: int | None = None
    """The largest message the broker takes on this topic (Kafka ``max.message.bytes``); None
    where the transport has no per-topic limit (Redis Streams)."""
    max_len: int | None = None
    """Entries kept per partition stream (Redis Streams ``XADD MAXLEN ~``); None where the
    transport does not keep a topic by length (Kafka, the in-memory transport)."""

    @property
    def message_count(self) -> int:
        """Messages currently retained, all partitions together."""
        return sum(self.message_counts)


@dataclass(frozen=True, slots=True)
class PartitionLag:
    """How far a consumer group is behind in one partition.

    Attributes:
        tp: the partition.
        committed: the group's committed position (next offset to consume), or None if none.
        end: the offset the next produced message will get.
        oldest_unconsumed_ms: timestamp of the oldest message not yet committed by the group,
            or None when the group is caught up.
        start: the first offset the partition still holds (those below it expired or were
            trimmed; ``end`` when it holds none), or None when the transport did not say.
        unreadable: why the partition cannot be read, in one line naming the key and what to
            do (Redis: its stream key holds another type), or None; then it holds nothing
            to read (``start`` is ``end``) and the other partitions are reported as usual.
    """

    tp: TopicPartition
    committed: int | None
    end: int
    oldest_unconsumed_ms: int | None
    start: int | None = None
    unreadable: str | None = None

    @property
    def lag(self) -> int:
        """Messages the group has not committed and the partition still holds.

        Those below ``start`` expired or were trimmed: the group will never read them, so they
        are not lag (a group behind retention, or one that never committed).
        """
        return max(0, self.end - max(self.committed or 0, self.start or 0))


StartAt = Literal["earliest", "latest"]


class RebalanceListener(Protocol):
    """Told when partitions move to or away from a group member.

    Both run inside :meth:`Consumer.poll` (or :meth:`Consumer.close`) and are awaited before the
    move completes, so a listener can finish in-flight work and hand back the positions to
    commit while this member still owns the partitions.
    """

    async def on_assigned(
        self, partitions: Sequence[TopicPartition], committed: Mapping[TopicPartition, Position]
    ) -> None:
        """Partitions were given to this member.

        ``committed`` has the group's stored positions (with metadata) of those that have one.
        """

    async def on_revoked(
        self, partitions: Sequence[TopicPartition], *, lost: bool
    ) -> Sequence[Position]:
        """Partitions are leaving this member; returns the positions to commit first.

        ``lost`` is true when ownership is already gone (the member was too slow to renew it):
        nothing can be committed then, and the returned positions are ignored.
        """
        ...


@runtime_checkable
class Producer(Protocol):
    """Produces keyed messages; each send resolves once the broker has acknowledged it."""

    async def send(
        self,
        topic: str,
        value: bytes,
        *,
        key: bytes | None = None,
        headers: Mapping[str, bytes] | None = None,
        partition: int | None = None,
    ) -> Delivered:
        """Produce one message and wait for the broker's acknowledgement.

        ``partition`` chooses the partition (else the key's, or any for no key).

        Raises:
            UnknownTopic: the topic does not exist, or ``partition`` is not one of its
                partitions (``0`` to the count less one; a negative one never is).
            MessageTooLarge: the message exceeds ``max_message_bytes``.
            BrokerUnavailable: the broker could not be reached in time.
            DeliveryFailed: the broker refused the message.
        """
        ...

    async def send_many(self, topic: str, records: Sequence[Record]) -> list[Delivered]:
        """Produce a batch in order and wait until the broker acknowledged all of it.

        Cheaper per message than awaiting :meth:`send` for each. Returns the receipts in the
        order of ``records``. If any message fails, raises the first error after the others
        settled; the ones that succeeded stay produced (delivery is at least once). A record
        above ``max_message_bytes`` (MessageTooLarge) or naming a partition the topic lacks
        (UnknownTopic) refuses the whole batch before any of it is sent.
        """
        ...

    async def flush(self, timeout_s: float = 30.0) -> None:
        """Wait until every message sent so far is acknowledged."""
        ...

    async def close(self) -> None:
        """Flush and release the connection."""
        ...


@runtime_checkable
class Consumer(Protocol):
    """One member of a consumer group reading a set of topics."""

    async def poll(self, max_messages: int = 500, timeout_s: float = 1.0) -> list[Message]:
        """Return up to ``max_messages`` messages, waiting at most ``timeout_s`` for the first.

        Messages of one partition come in offset order. Paused partitions yield nothing.
        """
        ...

    async def commit(self, positions: Sequence[Position]) -> None:
        """Declare every message below each position done; they are not redelivered."""
        ...

    async def committed(
        self, partitions: Sequence[TopicPartition]
    ) -> dict[TopicPartition, Position]:
        """The group's stored positions (with metadata) of those partitions that have one."""
        ...

    def pause(self, partitions: Sequence[TopicPartition]) -> None:
        """Stop fetching from these partitions until :meth:`resume`."""
        ...

    def resume(self, partitions: Sequence[TopicPartition]) -> None:
        """Fetch again from paused partitions."""
        ...

    def assignment(self) -> set[TopicPartition]:
        """The partitions this member owns now."""
        ...

    async def seek(self, tp: TopicPartition, offset: int) -> None:
        """Make the next poll of ``tp`` start at ``offset``."""
        ...

    async def rejoin(self) -> None:
        """Ask the group again which partitions are this member's.

        For a member that found a sign its view is stale (another member process took over a
        partition it still holds): the group's answer replaces that view at the next polls,
        through the listener, which may see its partitions revoked as lost and assigned again.
        """
        ...

    async def close(self) -> None:
        """Leave the group; owned partitions move to the other members."""
        ...


@runtime_checkable
class Reader(Protocol):
    """Reads topics from positions of its own, for a look (``pipeline tail``, a dry run).

    It is no member of a consumer group: it commits nothing and moves no group's position, and
    when its process is killed it leaves nothing on the broker (Redis Streams reads with
    ``XREAD``; Kafka's reader assigns itself every partition of its topics and joins no group).
    Partitions added to a topic after the reader started are not read.
    """

    async def poll(self, max_messages: int = 500, timeout_s: float = 1.0) -> list[Message]:
        """Return up to ``max_messages`` messages, waiting at most ``timeout_s`` for the first.

        Messages of one partition come in offset order.

        Raises:
            UnknownTopic: a topic read does not exist.
        """
        ...

    async def seek(self, tp: TopicPartition, offset: int) -> None:
        """Make the next polls of ``tp`` start at ``offset``."""
        ...

    async def close(self) -> None:
        """Release what the reader holds."""
        ...


class Admin(Protocol):
    """Creates and inspects topics and consumer-group positions."""

    async def list_topics(self, names: Collection[str] | None = None) -> dict[str, TopicInfo]:
        """Every topic the broker has, by name; with ``names``, only those of them that exist.

        A periodic caller should name what it needs: on a broker with thousands of topics the
        full listing (offsets and configs of every partition) costs seconds of CPU.
        """
        ...

    async def create_topic(self, config: TopicConfig) -> None:
        """Create a topic; raises TransportError if it exists."""
        ...

    async def update_topic(self, config: TopicConfig) -> None:
        """Grow partitions to ``config.partitions`` and apply retention and configs."""
        ...

    async def delete_topic(self, name: str) -> None:
        """Delete a topic and its messages; raises UnknownTopic if it does not exist."""
        ...

    async def group_lag(self, group: str, topic: str) -> list[PartitionLag]:
        """The group's position, lag and oldest unconsumed timestamp per partition."""
        ...

    async def delete_group(self, group: str, topics: Sequence[str]) -> None:
        """Forget a consumer group that has no members left (its positions on ``topics``).

        A group (or a topic of ``topics``) that does not exist is not an error. Raises
        GroupNotEmpty (Kafka) when members are still in the group.
        """
        ...

    async def close(self) -> None:
        """Release connections."""
        ...


class Transport(Protocol):
    """A broker: the factory for producers, group consumers, readers and the admin client."""

    name: str

    def producer(self) -> Producer:
        """A new producer."""
        ...

    def consumer(
        self,
        group: str,
        topics: Sequence[str],
        *,
        listener: RebalanceListener | None = None,
        member_id: str | None = None,
        start_at: StartAt = "earliest",
    ) -> Consumer:
        """A new member of ``group`` subscribed to ``topics``.

        ``start_at`` says where a group with no committed position starts reading: the oldest
        retained message (``earliest``) or only messages produced from now on (``latest``).
        """
        ...

    def reader(self, topics: Sequence[str], *, start_at: StartAt = "earliest") -> Reader:
        """A new reader of every partition of ``topics``, in no consumer group.

        ``start_at`` says where it starts: the oldest retained message (``earliest``) or only
        messages produced from its first poll on (``latest``; on Kafka, from when its group of
        its own is given the partitions, in its first polls).
        """
        ...

    def admin(self) -> Admin:
        """A new admin client."""
        ...

    async def close(self) -> None:
        """Release connections shared by the clients this transport made."""
        ...
