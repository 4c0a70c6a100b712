"""Deleting offloaded payloads nothing can need any more.

A reference can be read as long as some copy of it exists: in the lane's topic, its retry tiers
or its dead-letter topic, or in the ingress log, from which ``pipeline replay`` produces rows
again until ``pipeline purge`` deletes them (30 days by default). Objects are content-addressed
and shared by every message with the same body, so the purge goes by the object's last write
time. Every copy of a reference is produced less than
:data:`~pipeline.offload.writer.REFRESH_AFTER_S` after its object's last write: the writer
rewrites an object older than that instead of reusing it, and whatever produces a reference
again (retry tiers, dead letters, redrive, replay, the sweeper) first has
:meth:`~pipeline.offload.writer.Offloader.keep` rewrite an object that old.

So an object last written longer ago than the oldest copy still held, plus that refresh window,
has no reference left that may still be read. :func:`floor_ms` is the declared part of that age
(the longest of the lanes' retention, the dead-letter topic's at least 14 days, see
:data:`~pipeline.topics.spec.DLQ_MIN_RETENTION_MS`, and the log's); :func:`oldest_held_ms` asks
the transport for the oldest message its topics still hold, which is what counts on Redis
Streams (kept by length, not age) or on a Kafka topic kept longer than declared;
:func:`measured_floor_ms` takes the larger. The ingress log is measured too: ``pipeline purge``
deletes only processed and abandoned rows, so a row still ``received`` or ``produced`` (its
members do not mark rows processed, or it is stuck) outlives the log's declared retention and can
still be produced again by the sweeper or ``pipeline replay``; :func:`oldest_unfinished_row_ms`
finds the oldest one the declared floor does not cover, and counts as a message still held.
:func:`purge` deletes what is older. A reference read after its object is gone is a
``payload_missing`` dead letter, never a crash.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from pipeline.errors import TransportError, UnknownTopic
from pipeline.offload.observer import OffloadObserver
from pipeline.offload.store import PayloadStore
from pipeline.offload.writer import REFRESH_AFTER_S
from pipeline.topics.spec import DLQ_MIN_RETENTION_MS, TopicSpec
from pipeline.transport.protocol import Admin

LOG_RETENTION_MS = 30 * 86_400_000
"""``pipeline purge``'s default: ingress log rows (replayable) are kept this long."""
PROBE_GROUP = "pipeline-offload-purge"
"""The consumer group whose lag read finds each partition's oldest message: it never commits,
so its first unconsumed message is the oldest one still held."""


@dataclass
class PurgeReport:
    """What a purge found and did in one store."""

    store: str
    scanned: int = 0
    deleted: int = 0
    deleted_bytes: int = 0
    kept: int = 0


def stores(specs: Sequence[TopicSpec]) -> list[str]:
    """Every store a declaration offloads to, sorted."""
    return sorted({spec.offload.store for spec in specs if spec.offload is not None})


def floor_ms(specs: Sequence[TopicSpec], store: str, log_retention_ms: int) -> int:
    """The youngest age at which an object of ``store`` can be deleted, in milliseconds.

    The longest of the lanes' retention, their dead-letter retention and the log's, plus the
    writers' refresh window. A lane without ``retention`` counts with its DLQ's 14 days (the
    broker's own default, 7 days on Kafka, is shorter).
    """
    kept = [log_retention_ms, DLQ_MIN_RETENTION_MS]
    kept += [
        spec.retention_ms or 0
        for spec in specs
        if spec.offload is not None and spec.offload.store == store
    ]
    return max(kept) + int(REFRESH_AFTER_S * 1000)


def topics_of(specs: Sequence[TopicSpec], store: str) -> list[str]:
    """Every topic whose messages may carry a reference into ``store``, sorted."""
    return sorted(
        {
            name
            for spec in specs
            if spec.offload is not None and spec.offload.store == store
            for name in spec.topic_names()
        }
    )


async def oldest_held_ms(admin: Admin, topics: Sequence[str]) -> int | None:
    """The timestamp of the oldest message any partition of ``topics`` still holds.

    None when they hold none. A topic that does not exist holds nothing.

    Raises:
        TransportError: a partition holds messages but the oldest one's timestamp could not be
            read (the purge must not guess).
    """
    oldest: int | None = None
    for topic in topics:
        try:
            lag = await admin.group_lag(PROBE_GROUP, topic)
        except UnknownTopic:
            continue
        for partition in lag:
            held = partition.oldest_unconsumed_ms
            if held is None:
                if (partition.start or 0) < partition.end:
                    raise TransportError(
                        f"{partition.tp.topic}[{partition.tp.partition}] holds messages from"
                        f" offset {partition.start or 0}, but the oldest one's timestamp could"
                        " not be read; nothing was purged (run it again)"
                    )
                continue
            if oldest is None or held < oldest:
                oldest = held
    return oldest


class UnfinishedRows(Protocol):
    """What the purge asks the ingress log (every :class:`~pipeline.logstore.LogStore` answers)."""

    async def oldest_unfinished_ms(self, received_before_ms: int) -> int | None:
        """The receive time of the oldest row neither processed nor abandoned, received before."""
        ...


async def oldest_unfinished_row_ms(
    log: UnfinishedRows, declared_ms: int, now_ms: int
) -> int | None:
    """When the oldest log row a replay may still produce, older than ``declared_ms`` covers, came.

    A row neither processed nor abandoned keeps its reference replayable (the sweeper, ``pipeline
    replay``) however old it is, and its object was last written less than the refresh window
    before it came (a writer rewrites an object older than that instead of reusing it), so it
    counts as a message still held (:func:`measured_floor_ms`). Only rows received before
    ``now_ms - declared_ms`` plus the refresh window are looked at (younger ones are covered by
    the declared floor): the log walks its ``received_at_ms`` index over the rows older than that,
    which ``pipeline purge`` deletes once they are finished, and stops at the first unfinished one.
    None when there is none.

    Raises:
        LogStoreError: the log did not answer (the purge must not guess).
    """
    return await log.oldest_unfinished_ms(now_ms - declared_ms + int(REFRESH_AFTER_S * 1000))


def measured_floor_ms(declared_ms: int, oldest_held: int | None, now_ms: int) -> int:
    """The floor once the oldest message still held counts: never below ``declared_ms``."""
    if oldest_held is None:
        return declared_ms
    return max(declared_ms, now_ms - oldest_held + int(REFRESH_AFTER_S * 1000))


async def purge(
    store: PayloadStore,
    older_than_ms: int,
    *,
    dry_run: bool = False,
    now_s: float | None = None,
    observer: OffloadObserver | None = None,
    report: PurgeReport | None = None,
) -> PurgeReport:
    """Delete (or with ``dry_run`` only count) objects last written over ``older_than_ms`` ago.

    Idempotent: a run interrupted half way is finished by the next one. ``observer`` is told
    how many objects were deleted (not on a dry run). ``report``, when given, is counted in as
    the purge goes, so that a caller whose purge is stopped (Ctrl-C) can say how far it got.
    """
    cutoff_s = (time.time() if now_s is None else now_s) - older_than_ms / 1000
    if report is None:
        report = PurgeReport(store.url)
    old = []
    async for obj in store.list("sha256/"):
        report.scanned += 1
        if obj.last_modified.timestamp() < cutoff_s:
            old.append(obj)
        else:
            report.kept += 1
    for obj in old:
        # A writer rewrites an object it finds old and hands out a new reference to it
        # (identical bodies share one): one rewritten since the listing is kept.
        if not dry_run and not await store.delete_unless_written_since(obj.key, cutoff_s):
            report.kept += 1
            continue
        report.deleted += 1
        report.deleted_bytes += obj.size
    if observer is not None and not dry_run and report.deleted:
        observer.purged(store.url, report.deleted)
    return report
