"""Kafka topic administration and group lag through confluent-kafka's AdminClient."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Collection, Iterable, Sequence
from concurrent.futures import Future
from typing import Any, TypeVar

from confluent_kafka import Consumer as _RawConsumer
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka import TopicPartition as _RawTP
from confluent_kafka.admin import (
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewPartitions,
    NewTopic,
    OffsetSpec,
)

from pipeline.config import KafkaSettings
from pipeline.envelope import TopicPartition
from pipeline.errors import ConfigError, GroupNotEmpty, TransportError, UnknownTopic
from pipeline.transport.kafka.detached import detached
from pipeline.transport.kafka.errors import client_config_error, translate
from pipeline.transport.kafka.group import admin_client, client_properties
from pipeline.transport.protocol import PartitionLag, TopicConfig, TopicInfo

T = TypeVar("T")

# Pauses before the broker is asked again about something another client is changing (1.5 s in
# all): a group whose last member is still leaving, a partition whose topic is being created or
# deleted (it has a leader, or is gone, a moment later).
_SETTLING_PAUSES_S = (0.05, 0.1, 0.2, 0.4, 0.75)
# The probes' fetching. A lag read takes one record a partition, so its consumer keeps at most
# 1 MiB prefetched, not librdkafka's 64 MiB (which a backed-up lane would fill at every read,
# leaving the allocator's arenas behind), and a partition held back by that cap is fetched again
# 10 ms later rather than after the default second.
_ONE_RECORD = {
    "queued.max.messages.kbytes": 1024,
    "fetch.queue.backoff.ms": 10,
}
_NO_LEADER = {KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE}
_UNKNOWN_TOPIC = KafkaError.UNKNOWN_TOPIC_OR_PART
# A probe never joins its group, so a member's timings in PIPELINE_KAFKA__CLIENT mean nothing to
# it; passed on, a max.poll.interval.ms below librdkafka's default session timeout (45 s) would
# make every probe, and so every lag read, fail to be created.
_MEMBERSHIP_ONLY = frozenset(
    {
        "max.poll.interval.ms",
        "session.timeout.ms",
        "heartbeat.interval.ms",
        "group.instance.id",
        "group.protocol",
        "group.remote.assignor",
        "partition.assignment.strategy",
    }
)


def _broker_configs(config: TopicConfig) -> dict[str, str]:
    configs = dict(config.configs)
    if config.retention_ms is not None:
        configs["retention.ms"] = str(config.retention_ms)
    return configs


def _code(error: TransportError) -> int | None:
    """The Kafka error code behind ``error``, if a KafkaException caused it."""
    cause = error.__cause__
    return cause.args[0].code() if isinstance(cause, KafkaException) else None


def _gone(error: TransportError) -> bool:
    """The error says the topic does not exist (any more)."""
    return isinstance(error, UnknownTopic) or _code(error) == KafkaError._NOENT  # noqa: SLF001 - librdkafka's local error codes are spelled with an underscore


def _require_group(group: str) -> None:
    """Refuse a blank ``group``: librdkafka aborts the process on a consumer of that ``group.id``.

    Raises:
        ConfigError: the group is empty or whitespace (a variable that was unset, say).
    """
    if not group.strip():
        raise ConfigError(
            f"group {group!r}: a consumer group needs a name (is the variable or option that"
            " gives it unset?); give the lane's group, e.g. replies"
        )


def _no_leader(error: TransportError) -> bool:
    """The error says the partition has no leader at the moment."""
    return _code(error) in _NO_LEADER


class KafkaAdmin:
    """An :class:`~pipeline.transport.protocol.Admin` on confluent-kafka's AdminClient."""

    def __init__(self, settings: KafkaSettings) -> None:
        """Create the client; no request is made until a method is called."""
        self._settings = settings
        self._timeout_s = settings.request_timeout_ms / 1000
        self._raw = admin_client(settings)

    async def _wait(self, future: Future[T], context: str) -> T:
        try:
            return await asyncio.wrap_future(future)
        except KafkaException as exc:
            raise translate(exc, context) from exc

    async def _offsets(
        self, tps: Iterable[_RawTP], spec: OffsetSpec, *, skip_gone: bool = False
    ) -> dict[TopicPartition, int]:
        """Offsets per partition; with ``skip_gone`` a topic deleted meanwhile is left out.

        A partition without a leader (its topic being created or deleted by another client)
        is asked again after a pause, for 1.5 s in all; after that it fails, or with
        ``skip_gone`` is left out as a topic deleted meanwhile would be.
        """
        out: dict[TopicPartition, int] = {}
        pending = list(tps)
        for pause in (*_SETTLING_PAUSES_S, None):
            last = pause is None
            pending = await self._offsets_once(pending, spec, out, skip_gone=skip_gone, last=last)
            if pause is None or not pending:
                break
            await asyncio.sleep(pause)  # no leader yet: its topic is being changed
        return out

    async def _offsets_once(
        self,
        tps: list[_RawTP],
        spec: OffsetSpec,
        out: dict[TopicPartition, int],
        *,
        skip_gone: bool,
        last: bool,
    ) -> list[_RawTP]:
        """One request: offsets into ``out``; the partitions without a leader, unless ``last``."""
        request = dict.fromkeys(tps, spec)
        if not request:
            return []
        futures = self._raw.list_offsets(request, request_timeout=self._timeout_s)
        leaderless: list[_RawTP] = []
        for tp, fut in futures.items():
            try:
                info = await self._wait(fut, f"list offsets of {tp.topic}")
            except TransportError as exc:
                if not last and _no_leader(exc):
                    leaderless.append(tp)
                elif not (skip_gone and (_gone(exc) or _no_leader(exc))):
                    raise
                continue
            out[TopicPartition(tp.topic, tp.partition)] = info.offset
        return leaderless

    async def _metadata(self, topic: str | None = None) -> Any:
        """The cluster's metadata, or only ``topic``'s (its cost does not grow with the cluster)."""
        try:
            return await detached(self._raw.list_topics, topic, self._timeout_s)
        except KafkaException as exc:
            raise translate(exc, "list topics") from exc

    async def list_topics(self, names: Collection[str] | None = None) -> dict[str, TopicInfo]:
        """Non-internal topics (all, or ``names``) with partitions, retention and counts."""
        partitions = await self._partitions(names)
        names = sorted(partitions)
        tps = [_RawTP(n, p) for n in names for p in partitions[n]]
        # Another client may delete a topic between the metadata and these calls: such a topic
        # is left out, as if the metadata had been read a moment later.
        low = await self._offsets(tps, OffsetSpec.earliest(), skip_gone=True)
        high = await self._offsets(tps, OffsetSpec.latest(), skip_gone=True)
        names = [
            n
            for n in names
            if all(
                TopicPartition(n, p) in low and TopicPartition(n, p) in high for p in partitions[n]
            )
        ]
        described = await self._describe(names)
        out = {}
        for name in names:
            parts = sorted(partitions[name])
            counts = tuple(
                high[TopicPartition(name, p)] - low[TopicPartition(name, p)] for p in parts
            )
            retention, max_bytes = described.get(name, (None, None))
            out[name] = TopicInfo(name, len(parts), retention, counts, max_bytes)
        return out

    async def _partitions(self, names: Collection[str] | None) -> dict[str, list[int]]:
        """Partition ids of every non-internal topic, or of those of ``names`` that exist.

        Named topics are read from their own metadata, one request each on one thread, whose
        cost does not grow with the cluster (the metrics refresher asks for a lane's few topics
        on a broker that may hold thousands). Not ``describe_topics``: confluent-kafka 2.16
        leaks the ``Uuid`` of each topic it describes (never freed: a member's metrics refresh
        left one per dead-letter topic every 15 s).
        """
        if names is None:
            meta = await self._metadata()
            return {n: list(t.partitions) for n, t in meta.topics.items() if not n.startswith("__")}
        wanted = sorted({n for n in names if not n.startswith("__")})
        if not wanted:  # nothing to describe, but the broker still answers (a reachability probe)
            await self._wait(
                self._raw.describe_cluster(request_timeout=self._timeout_s), "list topics"
            )
            return {}
        try:
            return await detached(self._named_partitions, wanted)
        except KafkaException as exc:
            raise translate(exc, "list topics") from exc

    def _named_partitions(self, names: list[str]) -> dict[str, list[int]]:
        """:meth:`_partitions` of ``names``, blocking: a topic that does not exist is left out.

        Raises:
            KafkaException: the broker did not answer.
            TransportError: the broker refused a topic's metadata (the line names the topic).
        """
        out: dict[str, list[int]] = {}
        for name in names:
            found = self._raw.list_topics(name, timeout=self._timeout_s).topics.get(name)
            error = None if found is None else found.error
            if found is None or (error is not None and error.code() == _UNKNOWN_TOPIC):
                continue  # deleted meanwhile, or never made
            if error is not None and error.code() not in _NO_LEADER:
                raise translate(error, f"list topic {name}")  # not authorised, for one
            out[name] = sorted(found.partitions)
        return out

    async def _describe(self, names: list[str]) -> dict[str, tuple[int | None, int | None]]:
        """``retention.ms`` and ``max.message.bytes`` of each topic."""
        if not names:
            return {}
        resources = [ConfigResource(ConfigResource.Type.TOPIC, n) for n in names]
        described = self._raw.describe_configs(resources, request_timeout=self._timeout_s)
        out: dict[str, tuple[int | None, int | None]] = {}
        for resource, fut in described.items():
            try:
                entries = await self._wait(fut, f"describe {resource.name}")
            except UnknownTopic:  # deleted meanwhile: nothing to report
                continue
            retention = entries.get("retention.ms")
            max_bytes = entries.get("max.message.bytes")
            out[resource.name] = (
                int(retention.value) if retention and retention.value else None,
                int(max_bytes.value) if max_bytes and max_bytes.value else None,
            )
        return out

    async def create_topic(self, config: TopicConfig) -> None:
        """Create the topic with replication factor 1 per broker default (``-1``)."""
        topic = NewTopic(
            config.name,
            num_partitions=config.partitions,
            replication_factor=-1,
            config=_broker_configs(config),
        )
        futures = self._raw.create_topics([topic], request_timeout=self._timeout_s)
        await self._wait(futures[config.name], f"create topic {config.name!r}")
        await self._until_visible(config.name, config.partitions)

    async def _until_visible(self, name: str, partitions: int) -> None:
        """Wait until the broker's metadata shows the topic with a leader for every partition.

        A created topic takes a moment to propagate; returning before that makes the next
        produce or offset lookup fail with "unknown topic".
        """

        async def visible() -> bool:
            found = (await self._metadata()).topics.get(name)
            return (
                found is not None
                and found.error is None
                and len(found.partitions) >= partitions
                and all(p.leader >= 0 for p in found.partitions.values())
            )

        await self._until(visible, f"topic {name!r} created but not visible")

    async def _until(
        self, shown: Callable[[], Awaitable[bool]], failure: str, then: str = ""
    ) -> None:
        """Re-check ``shown`` until it holds, within the admin timeout.

        The broker acknowledges a change before every answer shows it. Past the timeout,
        ``failure`` (what is not shown), the time waited and ``then`` (what to do) are raised
        as a :class:`TransportError`.
        """
        deadline = time.monotonic() + self._timeout_s
        while not await shown():
            if time.monotonic() >= deadline:
                raise TransportError(f"{failure} after {self._timeout_s}s{then}")
            await asyncio.sleep(0.05)  # the brokers apply the change: re-check shortly

    async def update_topic(self, config: TopicConfig) -> None:
        """Grow partitions to ``config.partitions`` and set retention and configs.

        Returns once the broker's answers show the new partitions and retention: it
        acknowledges a change before every broker has applied it, so a listing right after it
        (``pipeline topics apply`` then ``topics list``) could show the old ones.
        """
        meta = await self._metadata()
        current = meta.topics.get(config.name)
        if current is None or current.error is not None:
            raise translate(KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART), f"update {config.name!r}")
        if config.partitions < len(current.partitions):
            raise TransportError(
                f"topic {config.name!r} has {len(current.partitions)} partitions; "
                f"Kafka cannot shrink it to {config.partitions}"
            )
        if config.partitions > len(current.partitions):
            futures = self._raw.create_partitions(
                [NewPartitions(config.name, config.partitions)], request_timeout=self._timeout_s
            )
            await self._wait(futures[config.name], f"add partitions to {config.name!r}")
        configs = _broker_configs(config)
        if configs:
            entries = [
                ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET)
                for k, v in configs.items()
            ]
            resource = ConfigResource(
                ConfigResource.Type.TOPIC, config.name, incremental_configs=entries
            )
            altered = self._raw.incremental_alter_configs([resource])
            await self._wait(altered[resource], f"alter configs of {config.name!r}")
        await self._until_shown(config)

    async def _until_shown(self, config: TopicConfig) -> None:
        """Wait until a listing shows ``config``'s partitions and retention (see update_topic)."""

        async def shown() -> bool:
            info = (await self.list_topics([config.name])).get(config.name)
            return (
                info is not None
                and info.partitions >= config.partitions
                and config.retention_ms in (None, info.retention_ms)
            )

        await self._until(
            shown,
            f"topic {config.name!r} updated but not yet shown with {config.partitions}"
            f" partitions and retention {config.retention_ms} ms",
            "; list it again shortly",
        )

    async def delete_topic(self, name: str) -> None:
        """Delete the topic; return once the broker's metadata no longer lists it.

        The broker acknowledges a deletion before every metadata answer has caught up: without
        the wait, a listing right after it could still show the topic.
        """
        futures = self._raw.delete_topics([name], request_timeout=self._timeout_s)
        await self._wait(futures[name], f"delete topic {name!r}")

        async def gone() -> bool:
            found = (await self._metadata()).topics.get(name)
            return found is None or found.error is not None

        await self._until(gone, f"topic {name!r} deleted but still listed")

    async def group_lag(self, group: str, topic: str) -> list[PartitionLag]:
        """Committed position, end offset and oldest unconsumed timestamp per partition.

        Raises:
            ConfigError: ``group`` is blank (:func:`_require_group`).
        """
        _require_group(group)
        meta = await self._metadata(topic)
        info = meta.topics.get(topic)
        if info is None or info.error is not None:
            raise translate(KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART), f"lag of {topic!r}")
        tps = [_RawTP(topic, p) for p in sorted(info.partitions)]
        committed = await detached(self._committed, group, tps)
        end = await self._offsets(tps, OffsetSpec.latest())
        start = await self._offsets(tps, OffsetSpec.earliest())
        first_unconsumed = {
            tp: max(committed.get(tp) or 0, start[tp])
            for tp in end
            if max(committed.get(tp) or 0, start[tp]) < end[tp]
        }
        oldest = await detached(self._timestamps_at, first_unconsumed)
        return [
            PartitionLag(tp, committed.get(tp), end[tp], oldest.get(tp), min(start[tp], end[tp]))
            for tp in sorted(end)
        ]

    async def delete_group(self, group: str, topics: Sequence[str]) -> None:  # noqa: ARG002
        """Delete the group and its committed offsets; a group that does not exist is gone already.

        The group must have no members. A member that has just closed can still be counted for
        a moment (its leave is being processed), so NON_EMPTY_GROUP is asked again a few times,
        ``_SETTLING_PAUSES_S`` apart, before it is raised. A static member that held its slot
        on close stays a member until its session expires. A blank ``group`` is a ConfigError
        (:func:`_require_group`), not a group that is gone already.
        """
        _require_group(group)
        for pause in (*_SETTLING_PAUSES_S, None):
            futures = self._raw.delete_consumer_groups([group], request_timeout=self._timeout_s)
            try:
                await asyncio.wrap_future(futures[group])
            except KafkaException as exc:
                code = exc.args[0].code() if exc.args else None
                if code == KafkaError.GROUP_ID_NOT_FOUND:
                    return
                if code != KafkaError.NON_EMPTY_GROUP:
                    raise translate(exc, f"delete group {group!r}") from exc
                if pause is None:
                    raise GroupNotEmpty(
                        f"delete group {group!r}: it still has members (stop them first; a"
                        " member that held its slot leaves when its session times out)"
                    ) from exc
            else:
                return
            await asyncio.sleep(pause)  # the broker is still processing a member's leave

    def _committed(self, group: str, tps: list[_RawTP]) -> dict[TopicPartition, int | None]:
        """The group's committed offsets, read by a consumer that never joins the group.

        ``AdminClient.list_consumer_group_offsets`` can crash the process in librdkafka while
        the group coordinator is still loading (confluentinc/librdkafka#5040); an OffsetFetch
        from a consumer that is not subscribed reads the same offsets without that path.
        """
        raw = self._probe(group)
        try:
            result = raw.committed(tps, timeout=self._timeout_s)
        except KafkaException as exc:
            raise translate(exc, f"offsets of group {group!r}") from exc
        finally:
            raw.close()
        return {
            TopicPartition(tp.topic, tp.partition): (tp.offset if tp.offset >= 0 else None)
            for tp in result
        }

    def _probe(self, group: str) -> _RawConsumer:
        """A consumer of ``group`` that never joins it; bad client properties are a ConfigError."""
        try:
            return self._open_probe(group)
        except KafkaException as exc:
            problem = client_config_error(exc, self._settings.client)
            raise problem or translate(exc, f"probe of group {group!r}") from None

    def _open_probe(self, group: str) -> _RawConsumer:
        _require_group(group)  # a blank group.id would abort the process, not raise
        return _RawConsumer(
            {
                "bootstrap.servers": self._settings.bootstrap_servers,
                "group.id": group,
                "enable.auto.commit": False,
                "logger": logging.getLogger("pipeline.librdkafka"),
                **{
                    k: v
                    for k, v in client_properties(self._settings, "consumer").items()
                    if k not in _MEMBERSHIP_ONLY
                },
                **_ONE_RECORD,
            }
        )

    def _timestamps_at(self, offsets: dict[TopicPartition, int]) -> dict[TopicPartition, int]:
        """Read one message at each offset with a group-less consumer to learn its timestamp."""
        if not offsets:
            return {}
        raw = self._probe("pipeline-admin-probe")
        out: dict[TopicPartition, int] = {}
        try:
            raw.assign([_RawTP(tp.topic, tp.partition, off) for tp, off in offsets.items()])
            deadline = time.monotonic() + self._timeout_s
            while len(out) < len(offsets) and time.monotonic() < deadline:
                for msg in raw.consume(100, 0.2):
                    tp = TopicPartition(str(msg.topic()), int(msg.partition() or 0))
                    if msg.error() is None and tp not in out:
                        out[tp] = msg.timestamp()[1]
                        raw.pause([_RawTP(tp.topic, tp.partition)])  # one message is enough
        finally:
            raw.close()
        return out

    async def close(self) -> None:
        """Nothing to release: the AdminClient holds no open work between calls."""
        await asyncio.sleep(0)
