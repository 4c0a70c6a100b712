"""Does the consumer group ``pipeline status`` reads exist, and which groups read the lane?

A group that never existed has committed nothing, so the lane's lag read for it counts every
message the topics hold, as if a real group were that far behind. ``pipeline status`` without
``--group`` reads a group named after each lane, so a lane consumed under another group name
(``--group replies``) showed such figures. :func:`missing_groups` asks the broker which of the
watched groups exist and, for a lane whose group does not, which groups read it, so the status
says so instead of the figures.
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

from pipeline.errors import BrokerUnavailable

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
        """Those of ``groups`` the broker has."""
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

    async def existing(self, groups: Collection[str]) -> set[str]:
        """Those of ``groups`` with live members or committed positions."""
        found = set()
        for group in groups:
            if await self._client.exists(self._keys.positions(group), self._keys.members(group)):
                found.add(group)
        return found

    async def readers(self, topics: Collection[str]) -> tuple[str, ...] | None:
        """The groups with a committed position on a partition of ``topics``."""
        head, tail = self._keys.positions("\0").split("\0")
        groups = set()
        async for raw in self._client.scan_iter(match=f"{head}*{tail}", count=1000):
            key = raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)
            fields = await self._client.hkeys(key)
            names = (f.decode(errors="replace") if isinstance(f, bytes) else str(f) for f in fields)
            if any(_topic_of(name) in topics for name in names):
                groups.add(key[len(head) : len(key) - len(tail)])
        return tuple(sorted(groups))


def _topic_of(field: str) -> str | None:
    """The topic of a positions hash's partition field (``topic:3``); None for another field."""
    topic, _, partition = field.rpartition(":")
    return topic if topic and partition.isdigit() else None


class KafkaGroups:
    """The Kafka cluster's groups: those it lists; a lane's readers, from their assignments."""

    def __init__(self, settings: KafkaSettings, timeout_s: float) -> None:
        """Ask the cluster of ``settings``, each request within ``timeout_s``."""
        from pipeline.transport.kafka.group import admin_client  # noqa: PLC0415 - when used

        self._admin = admin_client(settings)
        self._timeout_s = timeout_s
        self._listed: list[str] | None = None

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
        """Those of ``groups`` the cluster lists."""
        return set(groups) & set(await self._groups())

    async def readers(self, topics: Collection[str]) -> tuple[str, ...] | None:
        """The groups with a member assigned a partition of ``topics`` (live readers)."""
        listed = await self._groups()
        if not listed or len(listed) > MAX_DESCRIBED:
            return () if not listed else None
        futures = self._admin.describe_consumer_groups(listed, request_timeout=self._timeout_s)
        readers = []
        for group, future in futures.items():
            try:
                description = await asyncio.wrap_future(future)
            except Exception:  # a group gone since it was listed reads nothing  # noqa: S112
                continue
            assigned = {
                tp.topic
                for member in description.members
                if member.assignment is not None
                for tp in member.assignment.topic_partitions
            }
            if assigned & set(topics):
                readers.append(group)
        return tuple(sorted(readers))
