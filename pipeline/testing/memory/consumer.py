"""The in-memory :class:`~pipeline.transport.protocol.Consumer`: one member of a group."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Sequence

from pipeline.envelope import Message, Position, TopicPartition
from pipeline.testing.memory.broker import Entry, MemoryBroker
from pipeline.transport.protocol import RebalanceListener, StartAt

log = logging.getLogger(__name__)


class MemoryConsumer:
    """A group member of a :class:`MemoryBroker` (rules in :mod:`.broker`'s docstring)."""

    def __init__(
        self,
        broker: MemoryBroker,
        group: str,
        topics: Sequence[str],
        *,
        listener: RebalanceListener | None = None,
        member_id: str | None = None,
        start_at: StartAt = "earliest",
    ) -> None:
        """Join ``group`` at the first poll."""
        self._broker = broker
        self._group = group
        self._topics = tuple(topics)
        self._listener = listener
        self.member_id = member_id or uuid.uuid4().hex[:12]
        self._start_at = start_at
        self._owned: set[TopicPartition] = set()
        self._order: list[tuple[TopicPartition, list[Entry]]] = []
        """The owned partitions, sorted, with their logs (kept in step with ``_owned``)."""
        self._next: dict[TopicPartition, int] = {}
        self._paused: set[TopicPartition] = set()
        self._joined = False
        self._changes = 0
        """Bumped by whatever may make a scan find more (take-up, seek, resume)."""
        self._caught_up: tuple[int, int] | None = None
        """(broker appends, changes) when a scan last found every partition read to its end."""
        self._closed = False

    async def poll(self, max_messages: int = 500, timeout_s: float = 1.0) -> list[Message]:
        """Messages of owned, unpaused partitions in offset order, waiting for the first."""
        deadline = time.monotonic() + timeout_s
        while True:
            changed = self._broker.waiter()
            try:
                await self._heartbeat()
                out = self._fetch(max_messages)
                remaining_s = deadline - time.monotonic()
                if out or remaining_s <= 0:
                    return out
                # Not asyncio.wait_for: on Python 3.11 it loses a cancellation that lands as
                # the change wakes it (CPython issue 86296).
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(remaining_s):
                        await changed.wait()
            finally:
                self._broker.forget(changed)

    async def _heartbeat(self) -> None:
        """Stay in the group, hand over partitions that move away, take up the new ones."""
        broker = self._broker
        broker.check(f"consume {list(self._topics)}")
        for name in self._topics:
            broker.topic(name)  # UnknownTopic for an undeclared one
        if self._joined and self.member_id not in broker.groups[self._group].members:
            await self._lose_all()  # expired: this member's ownership is already gone
        await self._lose_replaced()
        broker.join(self._group, self.member_id, self._topics)
        self._joined = True
        broker.expire(self._group)
        target = broker.target(self._group, self.member_id)
        await self._release(sorted(self._owned - target))
        await self._take_up(target)

    async def _lose_all(self) -> None:
        lost = sorted(self._owned)
        self._drop(self._owned)
        if lost and self._listener is not None:
            await self._listener.on_revoked(lost, lost=True)

    async def _lose_replaced(self) -> None:
        """Lose the partitions of a topic deleted (and maybe created again) since the last poll.

        Their logs are gone: the member takes the new topic's partitions up afresh, from the
        start (deleting the topic forgot the group's positions), as a Kafka member does.
        """
        topics = self._broker.topics
        replaced = []
        for tp, log in self._order:
            topic = topics.get(tp.topic)
            logs = topic.partitions if topic is not None else []
            if tp.partition >= len(logs) or logs[tp.partition] is not log:
                replaced.append(tp)
        if not replaced:
            return
        self._drop(set(replaced))
        owners = self._broker.groups[self._group].owners
        for tp in replaced:
            if owners.get(tp) == self.member_id:
                del owners[tp]
        if self._listener is not None:
            await self._listener.on_revoked(replaced, lost=True)

    async def _release(self, leaving: list[TopicPartition]) -> None:
        """Revoke partitions that move to another member (the listener may commit first)."""
        if not leaving:
            return
        if self._listener is not None:
            await self.commit(await self._listener.on_revoked(leaving, lost=False))
        self._drop(set(leaving))
        owners = self._broker.groups[self._group].owners
        for tp in leaving:
            owners.pop(tp, None)
        self._broker.notify()

    async def _take_up(self, target: set[TopicPartition]) -> None:
        """Own the target partitions no other member holds; start at the committed positions."""
        owners = self._broker.groups[self._group].owners
        new = sorted(tp for tp in target - self._owned if tp not in owners)
        if not new:
            return
        committed = await self.committed(new)
        for tp in new:
            owners[tp] = self.member_id
            position = committed.get(tp)
            if position is not None:
                self._next[tp] = position.offset
            elif self._start_at == "latest":
                self._next[tp] = len(self._broker.topic(tp.topic).partitions[tp.partition])
            else:
                self._next[tp] = 0
            self._paused.discard(tp)  # a new assignment starts flowing
        self._owned.update(new)
        self._reorder()
        if self._listener is not None:
            await self._listener.on_assigned(new, committed)

    def _drop(self, partitions: set[TopicPartition]) -> None:
        for tp in list(partitions):
            self._owned.discard(tp)
            self._next.pop(tp, None)
            self._paused.discard(tp)
        self._reorder()

    def _reorder(self) -> None:
        topics = self._broker.topics
        self._order = [
            (tp, topics[tp.topic].partitions[tp.partition]) for tp in sorted(self._owned)
        ]
        self._changes += 1

    def _fetch(self, max_messages: int) -> list[Message]:
        stamp = (self._broker.appends, self._changes)
        if stamp == self._caught_up:
            return []
        out = self._scan(max_messages)
        self._caught_up = stamp if len(out) < max_messages else None
        return out

    def _scan(self, max_messages: int) -> list[Message]:
        out: list[Message] = []
        for tp, log in self._order:
            start = self._next[tp]
            if start >= len(log) or tp in self._paused:
                continue
            for offset in range(start, min(len(log), start + max_messages - len(out))):
                entry = log[offset]
                count = self._broker.delivered(self._group, tp, offset)
                out.append(
                    Message(
                        tp.topic,
                        tp.partition,
                        offset,
                        entry.key,
                        entry.value,
                        dict(entry.headers),
                        entry.timestamp_ms,
                        count,
                    )
                )
                self._next[tp] = offset + 1
            if len(out) >= max_messages:
                break
        return out

    async def commit(self, positions: Sequence[Position]) -> None:
        """Store each position (with its metadata) as the group's committed one.

        Only of the partitions this member owns, as the real transports fence commits: a stale
        commit for a partition that moved to another member would move its position back.
        """
        if not positions:
            return
        self._broker.check("commit")
        state = self._broker.groups[self._group]
        stale = [p.tp for p in positions if state.owners.get(p.tp) != self.member_id]
        if stale:
            log.warning(
                "%s: %s no longer owned by this member; not committed",
                self.member_id,
                sorted(f"{tp.topic}[{tp.partition}]" for tp in stale),
            )
        for position in positions:
            if position.tp not in stale:
                state.committed[position.tp] = position

    async def committed(
        self, partitions: Sequence[TopicPartition]
    ) -> dict[TopicPartition, Position]:
        """The group's stored positions of those partitions that have one."""
        self._broker.check("committed")
        stored = self._broker.groups[self._group].committed
        return {tp: stored[tp] for tp in partitions if tp in stored}

    def pause(self, partitions: Sequence[TopicPartition]) -> None:
        """Stop fetching these partitions."""
        self._paused.update(partitions)

    def resume(self, partitions: Sequence[TopicPartition]) -> None:
        """Fetch again from these partitions."""
        self._paused.difference_update(partitions)
        self._changes += 1
        self._broker.notify()

    def assignment(self) -> set[TopicPartition]:
        """The partitions this member owns now."""
        return set(self._owned)

    async def seek(self, tp: TopicPartition, offset: int) -> None:
        """Make the next poll of ``tp`` start at ``offset``."""
        self._next[tp] = offset
        self._changes += 1

    async def rejoin(self) -> None:
        """Nothing to do: every poll asks the broker which partitions are this member's."""

    async def close(self) -> None:
        """Revoke owned partitions through the listener (which may commit) and leave."""
        if self._closed:
            return
        self._closed = True
        owned = sorted(self._owned)
        if owned and self._listener is not None and self._broker.available:
            await self.commit(await self._listener.on_revoked(owned, lost=False))
        self._drop(self._owned)
        if self._joined:
            self._broker.leave(self._group, self.member_id)
