"""Where every unfinished event of a run is, read from the topics themselves.

An accepted webhook whose log row is not processed yet is not lost while its event still waits
in a topic: in its lane's main topic (not yet handled, e.g. held by a throttle) or in a retry
tier (retried, deferred by a throttle, or parked behind an earlier message of its key), or held
in Redis behind such a parked message (:mod:`.held`: its offset is committed, so it is in no
topic). The audit reads each consumer group's topics with a throwaway group, keeps the
``pl-row-id`` of every message at or past the real group's committed offset, adds the held
followers' row ids, and matches them against the log rows that are not processed. A row found
nowhere whose event a handler call finished (the observations say so) was handled but never
marked processed: the sweeper would replay it. What matches none of these is lost.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass

from pipeline import headers as h
from pipeline.envelope import TopicPartition
from pipeline.errors import PipelineError
from pipeline.logstore import LogStore, RowState, Selection
from pipeline.transport.protocol import Admin, Transport

log = logging.getLogger(__name__)
_PAGE_ROWS = 1_000


@dataclass(frozen=True, slots=True)
class GroupTopics:
    """A consumer group's main topic and its retry-tier topics."""

    main: str
    retry: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Audit:
    """Unfinished rows by where their event is.

    Attributes:
        unfinished: rows received in the run and not processed.
        in_retry: of those, events waiting in a retry tier, or held behind a parked key.
        waiting: of the rest, events not yet consumed from their main topic.
        complete: every topic was read to its end within the time allowed.
        unmarked: of the rest, events a handler call finished although their row is not
            marked processed.
        held: of ``in_retry``, events held in Redis behind a parked key (in no topic).
    """

    unfinished: int
    in_retry: int
    waiting: int
    complete: bool
    unmarked: int = 0
    held: int = 0


async def _unfinished_ids(store: LogStore, since_ms: int) -> dict[str, str]:
    """Row id -> event id of the rows received since ``since_ms`` and not processed."""
    selection = Selection(since_ms=since_ms, states=(RowState.RECEIVED, RowState.PRODUCED))
    ids: dict[str, str] = {}
    after = ""
    while rows := await store.select(selection, after_id=after, limit=_PAGE_ROWS):
        ids.update((row.id, row.event_id) for row in rows)
        after = rows[-1].id
    return ids


async def _spans(
    admin: Admin, group: str, topics: Sequence[str]
) -> dict[TopicPartition, tuple[int, int]]:
    """Per partition with uncommitted messages: (the group's committed offset, the end)."""
    spans = {}
    for topic in topics:
        for lag in await admin.group_lag(group, topic):
            if lag.end > (lag.committed or 0):
                spans[lag.tp] = (lag.committed or 0, lag.end)
    return spans


async def _pending_rows(
    transport: Transport, admin: Admin, group: str, topics: Sequence[str], timeout_s: float
) -> tuple[set[str], bool]:
    """Row ids of ``group``'s uncommitted messages on ``topics``; True if all were read."""
    spans = await _spans(admin, group, topics)
    if not spans:
        return set(), True
    audit_group = f"{group}-audit-{uuid.uuid4().hex[:8]}"
    consumer = transport.consumer(audit_group, list(topics), start_at="earliest")
    found: set[str] = set()
    deadline = time.monotonic() + timeout_s
    try:
        while spans and time.monotonic() < deadline:
            for message in await consumer.poll(2_000, 0.5):
                span = spans.get(message.tp)
                if span is None or message.offset < span[0]:
                    continue
                row = message.headers.get(h.ROW_ID)
                if row is not None:
                    found.add(row.decode())
                if message.offset >= span[1] - 1:
                    del spans[message.tp]
    finally:
        await consumer.close()
        try:
            await admin.delete_group(audit_group, list(topics))
        except PipelineError as exc:
            log.warning("could not delete the audit group %s: %s", audit_group, exc)
    return found, not spans


async def audit(
    transport: Transport,
    store: LogStore,
    since_ms: int,
    groups: Mapping[str, GroupTopics],
    finished_events: AbstractSet[str] = frozenset(),
    timeout_s: float = 60.0,
    held: AbstractSet[str] = frozenset(),
) -> Audit:
    """Classify the run's unfinished rows (received since ``since_ms``) by where they wait.

    ``finished_events`` are the event ids whose handler call finished (handled or dead-lettered);
    ``held``, the row ids held in Redis behind a parked key (:func:`.held.held_rows`).
    """
    unfinished = await _unfinished_ids(store, since_ms)
    if not unfinished:
        return Audit(0, 0, 0, complete=True)
    in_retry: set[str] = set()
    in_main: set[str] = set()
    complete = True
    admin = transport.admin()
    try:
        for group, topics in groups.items():
            retry, retry_done = await _pending_rows(
                transport, admin, group, topics.retry, timeout_s
            )
            main, main_done = await _pending_rows(transport, admin, group, [topics.main], timeout_s)
            in_retry |= retry & unfinished.keys()
            in_main |= main & unfinished.keys()
            complete = complete and retry_done and main_done
    finally:
        await admin.close()
    held_now = (held & unfinished.keys()) - in_retry
    in_retry |= held_now
    nowhere = unfinished.keys() - in_retry - in_main
    unmarked = sum(1 for row in nowhere if unfinished[row] in finished_events)
    return Audit(
        len(unfinished),
        len(in_retry),
        len(in_main - in_retry),
        complete,
        unmarked,
        held=len(held_now),
    )
