"""Does the consumer group ``pipeline status`` reads exist, and which groups read the lane?

A group that never existed has committed nothing, so the lane's lag read for it counts every
message the topics hold, as if a real group were that far behind. ``pipeline status`` without
``--group`` reads a group named after each lane, so a lane consumed under another group name
(``--group replies``) showed such figures. :func:`missing_groups` asks the broker which of the
watched groups exist and, for a lane whose group does not, which groups read it, so the status
says so instead of the figures.

One ``pipeline status`` asks each broker once, whatever the number of lanes: Redis's keyspace
is scanned once for the groups' positions, Kafka's groups described once. A group the broker
does not list is not taken as missing before it is asked for by name: a Kafka client under
ACLs lists only the groups it may describe, and a group whose existence the broker would not
tell (the describe refused, or not answered) is no missing group.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

from pipeline.errors import BrokerUnavailable

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from redis.asyncio import Redis

    from pipeline.config import KafkaSettings
    from pipeline.observability.lanes import LaneWatch

__all__ = ["GroupDirectory", "KafkaGroups", "RedisGroups", "missing_groups"]

MAX_DESCRIBED = 50
"""Most Kafka groups described to find a lane's readers; past it the broker is not asked."""


class GroupDirectory(Protocol):
    """A broker's consumer groups, as far as ``pipeline status`` asks."""

    async def existing(self, groups: Collection[str]) -> set[str]:
        """Those of ``groups`` the broker has, or would not say it lacks."""
        ...

    async def readers(self, topics: Collection[str]) -> tuple[str, ...] | None:
        """The groups reading any of ``topics``, sorted; None when the broker cannot tell."""
        ...


async def missing_groups(
    directory: GroupDirectory, watches: Sequence[LaneWatch]
) -> Mapping[tuple[str, str], tuple[str, ...] | None]:
    """(lane, group) of every watch whose group does not exist -> the groups reading the lane.

    The readers are None when the broker did not tell (too many groups, or it failed to answer).
    """
    existing = await directory.existing({watch.group for watch in watches})
    out: dict[tuple[str, str], tuple[str, ...] | None] = {}
    for watch in watches:
        if watch.group in existing:
            continue
        topics = {*watch.topics, *(t for tier in watch.retry_topics.values() for t in tier)}
        out[watch.lane, watch.group] = await directory.readers(topics)
    return out


class RedisGroups:
    """The Redis transport's groups: a group exists once it has members or positions."""

    def __init__(self, client: Redis, prefix: str) -> None:
        """Groups under ``prefix`` (``PIPELINE_REDIS__KEY_PREFIX``) of ``client``'s Redis."""
        from pipeline.transport.redis_streams.keys import Keys  # noqa: PLC0415 - when used

        self._client = client
        self._keys = Keys(prefix)
        self._positions: dict[str, frozenset[str]] | None = None

    async def existing(self, groups: Collection[str]) -> set[str]:
        """Those of ``groups`` with live members or committed positions."""
        found = set()
        for group in groups:
            if await self._client.exists(self._keys.positions(group), self._keys.members(group)):
                found.add(group)
        return found

    async def readers(self, topics: Collection[str]) -> tuple[str, ...] | None:
        """The groups with a committed position on a partition of ``topics``."""
        positions = await self._all_positions()
        wanted = set(topics)
        return tuple(sorted(group for group, read in positions.items() if read & wanted))

    async def _all_positions(self) -> dict[str, frozenset[str]]:
        """Every group -> the topics it has positions on: one SCAN of the keyspace, then kept."""
        if self._positions is None:
            head, tail = self._keys.positions("\0").split("\0")
            positions = {}
            async for raw in self._client.scan_iter(match=f"{head}*{tail}", count=1000):
                key = raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)
                fields = await self._client.hkeys(key)
                names = (
                    f.decode(errors="replace") if isinstance(f, bytes) else str(f) for f in fields
                )
                read = frozenset(t for t in map(_topic_of, names) if t is not None)
                positions[key[len(head) : len(key) - len(tail)]] = read
            self._positions = positions
        return self._positions


def _topic_of(field: str) -> str | None:
    """The topic of a positions hash's partition field (``topic:3``); None for another field."""
    topic, _, partition = field.rpartition(":")
    return topic if topic and partition.isdigit() else None


class KafkaGroups:
    """The Kafka cluster's groups, listed or asked by name; a lane's readers, from assignments."""

    def __init__(self, settings: KafkaSettings, timeout_s: float) -> None:
        """Ask the cluster of ``settings``, each request within ``timeout_s``."""
        from pipeline.transport.kafka.group import admin_client  # noqa: PLC0415 - when used

        self._admin = admin_client(settings)
        self._timeout_s = timeout_s
        self._listed: list[str] | None = None
        self._assigned: dict[str, frozenset[str]] = {}
        """Group described -> the topics its members are assigned."""
        self._lacking: set[str] = set()
        """Groups the cluster said it does not have."""
        self._untold: set[str] = set()
        """Groups it did not describe (refused, or not answered)."""

    async def _groups(self) -> list[str]:
        if self._listed is None:
            future = self._admin.list_consumer_groups(request_timeout=self._timeout_s)
            try:
                result = await asyncio.wrap_future(future)
            except Exception as exc:  # a KafkaException: the status says it cannot tell
                raise BrokerUnavailable(f"list consumer groups: {exc}") from exc
            self._listed = sorted(group.group_id for group in result.valid)
        return self._listed

    async def existing(self, groups: Collection[str]) -> set[str]:
        """Those of ``groups`` the cluster lists, or describes, or would not say it lacks.

        A group not listed is described by name: under ACLs the list leaves out the groups
        the client may not describe, and one it may describe may have been made since. Kafka
        describes a group it lacks as ``DEAD`` (or answers ``GROUP_ID_NOT_FOUND``); any other
        failure tells nothing, and the group is taken as existing.
        """
        listed = set(groups) & set(await self._groups())
        unlisted = [group for group in groups if group not in listed]
        await self._describe(unlisted)
        return listed | {group for group in unlisted if group not in self._lacking}

    async def readers(self, topics: Collection[str]) -> tuple[str, ...] | None:
        """The groups with a member assigned a partition of ``topics`` (live readers)."""
        listed = await self._groups()
        if not listed or len(listed) > MAX_DESCRIBED:
            return () if not listed else None
        await self._describe(listed)
        wanted = set(topics)
        return tuple(
            sorted(group for group in listed if self._assigned.get(group, frozenset()) & wanted)
        )

    async def _describe(self, groups: Collection[str]) -> None:
        """Describe those of ``groups`` not described yet, in one request, and keep the result."""
        from confluent_kafka import ConsumerGroupState, KafkaError  # noqa: PLC0415

        asked = self._assigned.keys() | self._lacking | self._untold
        new = [group for group in groups if group not in asked]
        if not new:
            return
        futures = self._admin.describe_consumer_groups(new, request_timeout=self._timeout_s)
        for group, future in futures.items():
            try:
                description = await asyncio.wrap_future(future)
            except Exception as exc:  # a KafkaException: refused (ACLs), or not answered
                error = exc.args[0] if exc.args else None
                if isinstance(error, KafkaError) and error.code() == KafkaError.GROUP_ID_NOT_FOUND:
                    self._lacking.add(group)
                else:
                    log.debug("describe consumer group %s: %s", group, exc)
                    self._untold.add(group)
                continue
            if description.state == ConsumerGroupState.DEAD:  # how Kafka describes no group
                self._lacking.add(group)
                continue
            self._assigned[group] = frozenset(
                tp.topic
                for member in description.members
                if member.assignment is not None
                for tp in member.assignment.topic_partitions
            )
