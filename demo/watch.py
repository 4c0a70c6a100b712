"""Reads the running pipeline from the outside: observations, log rows, topic counts.

Nothing here asks the processes themselves: observations come from the Redis stream of
:mod:`.observe`, the fate of every accepted webhook from the ingress log store (rows marked
processed by the consumers), retries and dead letters from the message counts of the retry-tier
and dead-letter topics (minus what they held before the run, for brokers shared across runs), and
what waits in a retry tier from each group's lag on its retry topics (a message held until its
due time, or parked behind an earlier message of its key, is not committed yet).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from redis.asyncio import Redis

from demo.audit import GroupTopics
from demo.observe import RedisObservations
from demo.stats import Collector
from pipeline.errors import PipelineError
from pipeline.logstore import LogStore, RowState, Selection
from pipeline.transport.protocol import Admin

log = logging.getLogger(__name__)


class Watcher:
    """Keeps a :class:`Collector` and the counts of one run up to date."""

    def __init__(
        self,
        redis: Redis,
        prefix: str,
        admin: Admin,
        store: LogStore,
        collector: Collector,
        groups: Mapping[str, GroupTopics],
    ) -> None:
        """Watch the observations under ``prefix``, the topics of ``admin`` and ``store``.

        ``groups`` maps each consumer group to the topics it consumes.
        """
        self.collector = collector
        self.rows: dict[RowState, int] = {}
        self.dead_lettered = 0
        self.retried = 0
        self.in_retry = 0
        self.main_backlog = 0
        self._groups = dict(groups)
        self._observations = RedisObservations(redis, prefix)
        self._admin = admin
        self._store = store
        self._last_id = "0"
        self._baseline: dict[str, int] | None = None

    async def baseline(self) -> None:
        """Remember the retry and dead-letter counts from before the run."""
        self._baseline = await self._counts()

    async def observe(self) -> int:
        """Fold in every observation recorded since the last call; return how many."""
        total = 0
        while True:
            self._last_id, batch = await self._observations.read(self._last_id)
            if not batch:
                return total
            self.collector.add_all(batch)
            total += len(batch)

    async def poll_counts(self) -> None:
        """Refresh log rows per state, the retry and dead-letter counts and the retry backlog.

        Rows are counted before the retry backlog, so a message moving from a retry tier to
        processed between the two reads is never missed by both (lost is never under-counted).
        """
        try:
            selection = Selection(since_ms=self.collector.start_ms)
            self.rows = await self._store.count_by_state(selection)
        except PipelineError as exc:
            log.warning("could not count log rows: %s", exc)
        try:
            counts = await self._counts()
        except PipelineError as exc:
            log.warning("could not count topic messages: %s", exc)
            return
        base = self._baseline or {}
        dead = retried = 0
        for topic, count in counts.items():
            delta = max(0, count - base.get(topic, 0))
            if topic.endswith(".dlq"):
                dead += delta
            else:
                retried += delta
        self.dead_lettered, self.retried = dead, retried
        try:
            self.in_retry = await self._lag(retry=True)
            self.main_backlog = await self._lag(retry=False)
        except PipelineError as exc:
            log.warning("could not read the groups' lag: %s", exc)

    async def _lag(self, *, retry: bool) -> int:
        """Uncommitted messages of every group on its retry topics (or its main topic).

        An estimate: on an unordered lane, messages finished above the committed offset count
        too (:mod:`.audit` counts exactly, at the end).
        """
        total = 0
        for group, topics in self._groups.items():
            for topic in topics.retry if retry else (topics.main,):
                total += sum(p.lag for p in await self._admin.group_lag(group, topic))
        return total

    async def _counts(self) -> dict[str, int]:
        # The demo's lanes keep the default dead-letter name, <main>.dlq.
        wanted = {n for t in self._groups.values() for n in (*t.retry, f"{t.main}.dlq")}
        topics = await self._admin.list_topics(wanted)
        return {
            name: info.message_count
            for name, info in topics.items()
            if name.endswith(".dlq") or ".retry." in name
        }
