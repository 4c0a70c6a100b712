"""The state an in-memory broker keeps: topics of partitions, consumer groups, their members.

One :class:`MemoryBroker` is what a Kafka cluster or a Redis server is to the real transports:
every producer, consumer and admin client made by the :class:`MemoryTransport` objects that
share it sees the same topics and groups. It implements the transport contract
(``tests/contract/``) with the same rules as the real brokers:

* a partition is an append-only list; an offset is an index into it;
* a group's members share the partitions of their topics round-robin, each partition owned by
  one member at a time; hand-over is cooperative (the old owner revokes at its next poll, the
  new owner takes it up at its next poll);
* a member that has not polled for ``session_timeout_ms`` is dead: its partitions go to the
  others, which read from the group's committed position, so its uncommitted work is
  redelivered, each delivery counted per group and offset (``Message.delivery_count``);
* a member commits only the partitions it owns: a stale commit for one that moved to another
  member is dropped with a warning, as the real transports fence it;
* deleting a topic forgets every group's positions and delivery counts on it, so a topic
  created again is read from offset 0, as Kafka forgets a deleted topic's offsets (its running
  members lose the old partitions at their next poll and take the new ones up).

Time is read from :func:`time.time` and :func:`time.monotonic`, so the virtual clock of
:mod:`pipeline.testing.clock` moves it. Everything runs on one event loop; no locks are needed.
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from collections.abc import Collection
from dataclasses import dataclass, field

from pipeline.config import declare_hint
from pipeline.envelope import Position, TopicPartition
from pipeline.errors import BrokerUnavailable, UnknownTopic


@dataclass(slots=True)
class Entry:
    """One stored message."""

    key: bytes | None
    value: bytes
    headers: dict[str, bytes]
    timestamp_ms: int
    seq: int = 0
    """Its place among every message appended to the broker (1 for the first), set on append:
    produce order across topics and partitions, which timestamps (to the millisecond, and all
    equal on a virtual clock between loop turns) do not give."""


@dataclass(slots=True)
class Topic:
    """A topic: its partitions and retention."""

    name: str
    partitions: list[list[Entry]]
    retention_ms: int | None = None


@dataclass(slots=True)
class Group:
    """A consumer group: committed positions, members in join order, partition owners."""

    committed: dict[TopicPartition, Position] = field(default_factory=dict)
    members: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """Member id to the topics it subscribed to, in join order."""
    last_seen: dict[str, float] = field(default_factory=dict)
    """Member id to the monotonic time of its last poll."""
    owners: dict[TopicPartition, str] = field(default_factory=dict)
    deliveries: defaultdict[tuple[TopicPartition, int], int] = field(
        default_factory=lambda: defaultdict(int)
    )
    targets: dict[str, tuple[int, set[TopicPartition]]] = field(default_factory=dict)
    """Member id to its target partitions, computed at broker version N (a cache)."""


class MemoryBroker:
    """Topics and groups held in this process (see the module docstring)."""

    def __init__(self, *, session_timeout_ms: int = 10_000, available: bool = True) -> None:
        """An empty broker; members silent for ``session_timeout_ms`` are dropped.

        ``available=False`` makes every call fail with :class:`BrokerUnavailable`, as a broker
        that does not answer would (set :attr:`available` to switch it at any time).
        """
        self.session_timeout_ms = session_timeout_ms
        self.available = available
        self.topics: dict[str, Topic] = {}
        self.appends = 0
        """Messages appended so far, all topics (a poll with nothing new skips its scan)."""
        self.version = 0
        """Bumped when topics or group memberships change (targets are cached per version)."""
        self.groups: dict[str, Group] = defaultdict(Group)
        self._waiters: set[asyncio.Event] = set()

    # -- availability and change notification --------------------------------------------------

    def check(self, what: str) -> None:
        """Raise :class:`BrokerUnavailable` when the broker is switched off."""
        if not self.available:
            raise BrokerUnavailable(f"{what}: the in-memory broker is unavailable")

    def waiter(self) -> asyncio.Event:
        """An event set at the next change (a message produced, a member joining or leaving)."""
        event = asyncio.Event()
        self._waiters.add(event)
        return event

    def forget(self, event: asyncio.Event) -> None:
        """Stop notifying ``event``."""
        self._waiters.discard(event)

    def changed(self) -> None:
        """Topics or memberships changed: targets must be computed again; wake the polls."""
        self.version += 1
        self.notify()

    def notify(self) -> None:
        """Wake every poll waiting for a change."""
        for event in self._waiters:
            event.set()

    # -- topics -----------------------------------------------------------------------------------

    def topic(self, name: str) -> Topic:
        """The topic ``name``; raises :class:`UnknownTopic` if it is not declared."""
        topic = self.topics.get(name)
        if topic is None:
            raise UnknownTopic(
                f"topic {name!r} does not exist ({declare_hint()}, or TestApp creates the App's"
                " topics)"
            )
        return topic

    def append(self, name: str, partition: int, entry: Entry) -> int:
        """Store ``entry`` at the end of the partition; returns its offset."""
        log = self.topic(name).partitions[partition]
        self.appends += 1
        entry.seq = self.appends
        log.append(entry)
        self.notify()
        return len(log) - 1

    # -- groups -----------------------------------------------------------------------------------

    def join(self, group: str, member: str, topics: tuple[str, ...]) -> None:
        """Add ``member`` to ``group`` (or mark it alive)."""
        state = self.groups[group]
        if member not in state.members:
            state.members[member] = topics
            self.changed()
        state.last_seen[member] = time.monotonic()

    def leave(self, group: str, member: str) -> None:
        """Remove ``member``; the partitions it owned are free for the others."""
        state = self.groups[group]
        state.members.pop(member, None)
        state.last_seen.pop(member, None)
        for tp in [tp for tp, owner in state.owners.items() if owner == member]:
            del state.owners[tp]
        self.changed()

    def expire(self, group: str) -> None:
        """Drop the members of ``group`` that have been silent longer than the session timeout."""
        state = self.groups[group]
        limit = time.monotonic() - self.session_timeout_ms / 1000
        for member in [m for m, seen in state.last_seen.items() if seen < limit]:
            self.leave(group, member)

    def target(self, group: str, member: str) -> set[TopicPartition]:
        """The partitions ``member`` should own: round-robin over the members of each topic."""
        state = self.groups[group]
        cached = state.targets.get(member)
        if cached is not None and cached[0] == self.version:
            return cached[1]
        out: set[TopicPartition] = set()
        for name in state.members.get(member, ()):
            topic = self.topics.get(name)
            if topic is None:
                continue
            sharing = [m for m, subscribed in state.members.items() if name in subscribed]
            index = sharing.index(member)
            out |= {
                TopicPartition(name, p)
                for p in range(len(topic.partitions))
                if p % len(sharing) == index
            }
        state.targets[member] = (self.version, out)
        return out

    def forget_topics(self, group: str, topics: Collection[str]) -> None:
        """Drop what ``group`` recorded on ``topics``: committed positions and delivery counts."""
        state = self.groups.get(group)
        if state is None:
            return
        for tp in [tp for tp in state.committed if tp.topic in topics]:
            del state.committed[tp]
        for seen in [seen for seen in state.deliveries if seen[0].topic in topics]:
            del state.deliveries[seen]

    def delivered(self, group: str, tp: TopicPartition, offset: int) -> int:
        """Count one delivery of ``offset`` to ``group``; returns the count so far."""
        counts = self.groups[group].deliveries
        counts[(tp, offset)] += 1
        return counts[(tp, offset)]
