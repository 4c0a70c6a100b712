"""Partitions a cooperative rebalance left to no member, and the nudge that gives them out.

Under the classic protocol with ``cooperative-sticky`` a partition changes members in two
rebalances: in the first the group's leader takes it from its owner and gives it to nobody; the
owner revokes it and joins again, and the second rebalance gives it to its new member. When the
owner dies between the two and comes back as a static member (the same ``group.instance.id``),
the coordinator hands the new process the old one's assignment without a rebalance. The new
process never held the partition, so it revokes nothing and does not join again: the partition
stays assigned to no member, in a group that looks stable, until its membership next changes.
Two members killed while their group was still forming left half of a lane's partitions so
(``tests/faults``, the Kafka kill-consumers scenario).

A :class:`StrandWatch` asks the group coordinator about its group every ``interval_s``. When
the same partitions of its topics were assigned to no member at two checks in a row of a stable
group, it nudges the group: a dynamic member with the group's protocol joins, which makes the
coordinator rebalance, and leaves once it is assigned, which rebalances again; the partitions go
out in those rebalances. The nudging member reads nothing: it never commits, and what it
fetched meanwhile is dropped. :meth:`StrandWatch.stop` ends a check still waiting for the
coordinator (an unreachable broker answers only after the request timeout) and a nudge still
waiting for its assignment, so a consumer that closes is not held up by either.

librdkafka must never time the coordinator's description out itself: an admin request to a group
coordinator whose admin timeout fires while the coordinator's answer is still outstanding, and
which is answered afterwards, aborts the process (``rd_kafka_enq_once_del_source_return``'s
assertion, seen with the broker paused past the session timeout). The description is asked with
a timeout of ``_DESCRIBE_TIMEOUT_S``, longer than any outage a member waits through, and waited
for only the request timeout, as before, without being cancelled; until it is answered no check
asks again: each finds nothing stranded, at once.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any, TypeVar

from confluent_kafka import Consumer as _RawConsumer
from confluent_kafka import ConsumerGroupState, KafkaException, TopicCollection

from pipeline.config import KafkaSettings
from pipeline.transport.kafka.group import admin_client, consumer_config

log = logging.getLogger(__name__)

_MIN_INTERVAL_S = 5.0
"""Checks are at least this far apart, whatever the session timeout."""

_SLICE_S = 0.1
"""A stopped watch gives up waiting for the coordinator, or for its nudge, within this."""

_DESCRIBE_EVERY_S = 300.0
"""The topics' partitions are described again at most this often, or sooner when the group's
assignment disagrees with them otherwise than it did at the last description: it names a
partition of them not known yet (its topic grew) or leaves a known one to no member (confirmed
on a fresh description), and at the next check when a topic could not be described (deleted, or
not answered in time). The same partitions left unowned check after check (stranded, or their
member slow to join) are confirmed once. confluent-kafka 2.16 leaks the ``Uuid`` of every topic
it describes: described at every check, a member kept one more per topic every session timeout,
for as long as it ran."""

_DESCRIBE_TIMEOUT_S = 600.0
"""librdkafka's own timeout of the coordinator's description: far past any outage a member waits
through, so the answer (or the broker's error) always comes before it; the watch itself waits
only the request timeout."""

Partitions = frozenset[tuple[str, int]]
T = TypeVar("T")


class StrandWatch:
    """Finds partitions of a classic group's topics that no member owns, and nudges the group."""

    def __init__(self, settings: KafkaSettings, group: str, topics: Sequence[str]) -> None:
        """Watch ``group``'s assignment of ``topics``; a check at most every session timeout."""
        self._settings = settings
        self._group = group
        self._topics = list(topics)
        self.interval_s = max(settings.session_timeout_ms / 1000, _MIN_INTERVAL_S)
        self._next_s = time.monotonic() + self.interval_s
        self._seen: Partitions = frozenset()
        """What the previous check found assigned to no member."""
        self._admin: Any = None
        self._stopped = threading.Event()
        self._partitions: Partitions = frozenset()
        """Every partition of the topics, as last described."""
        self._described_s = float("-inf")
        self._confirmed: Partitions = frozenset()
        """The partitions left unowned when the topics were last described."""
        self._pending: Future[Any] | None = None
        """A description of the group not answered in the request timeout, still awaited."""
        self._skipped = False
        """Whether a check skipped for ``_pending`` has said so already."""

    def due(self) -> bool:
        """Whether the next check is due (never, once stopped)."""
        return not self._stopped.is_set() and time.monotonic() >= self._next_s

    def stop(self) -> None:
        """No more checks; a nudge under way leaves the group now instead of waiting on."""
        self._stopped.set()

    def check(self) -> Partitions:
        """Ask the coordinator; nudge the group if partitions stayed unowned since the last check.

        Blocking (the coordinator's answer, and a nudge's join and leave): run it off the event
        loop and off the consumer's own thread. Returns the partitions it nudged for.
        """
        self._next_s = time.monotonic() + self.interval_s
        if self._stopped.is_set():
            return frozenset()
        try:
            now = self._unowned()
        except (KafkaException, TimeoutError) as exc:  # asked again at the next check
            log.debug("could not describe group %s: %r", self._group, exc)
            self._seen = frozenset()
            return frozenset()
        stranded = now & self._seen
        self._seen = now
        if not stranded or self._stopped.is_set():  # stopped while the coordinator answered
            return frozenset()
        log.warning(
            "%s of group %s assigned to no member for %.0f s (the second half of a cooperative"
            " rebalance did not come: the member giving them up died, or has not revoked them"
            " yet): a member joins and leaves to give them out",
            sorted(f"{topic}[{partition}]" for topic, partition in stranded),
            self._group,
            self.interval_s,
        )
        self._nudge()
        self._seen = frozenset()
        return stranded

    def _unowned(self) -> Partitions:
        """The partitions of the topics no member of the stable group owns (empty otherwise)."""
        if self._admin is None:
            self._admin = admin_client(self._settings)
        admin = self._admin
        timeout_s = self._settings.request_timeout_ms / 1000
        if self._waiting():
            return frozenset()
        futures = admin.describe_consumer_groups([self._group], request_timeout=_DESCRIBE_TIMEOUT_S)
        try:
            group = self._answer(futures[self._group], timeout_s)
        except TimeoutError:  # left to librdkafka to answer; not asked again meanwhile
            self._pending, self._skipped = futures[self._group], False
            raise
        if group.state != ConsumerGroupState.STABLE or not group.members:
            return frozenset()
        watched = set(self._topics)  # other members may consume topics this one does not
        owned = {
            (tp.topic, tp.partition)
            for member in group.members
            for tp in member.assignment.topic_partitions
            if tp.topic in watched
        }
        stale = time.monotonic() - self._described_s >= _DESCRIBE_EVERY_S
        unknown, unowned = owned - self._partitions, self._partitions - owned
        if stale or unknown or (unowned and unowned != self._confirmed):
            # A partition owned but not known (its topic grew) is described at every check until
            # a description names it; unowned ones are confirmed on a fresh description (a topic
            # made again smaller), and the same ones at the next checks are not: a partition
            # stranded for good would otherwise have the topics described at every check.
            self._partitions, whole = self._described(admin, timeout_s)
            self._confirmed = frozenset(self._partitions - owned)
            # One that left a topic out is asked again at the next check, not kept 5 min.
            self._described_s = time.monotonic() if whole else float("-inf")
        return frozenset(self._partitions - owned)

    def _waiting(self) -> bool:
        """Whether an earlier description of the group is still unanswered (said once, DEBUG)."""
        pending = self._pending
        if pending is None:
            return False
        if pending.done():  # its answer is stale now: the check asks afresh
            self._pending = None
            return False
        if not self._skipped:
            self._skipped = True
            log.debug("group %s's description is still unanswered: check skipped", self._group)
        return True

    def _described(self, admin: Any, timeout_s: float) -> tuple[Partitions, bool]:
        """Every partition of the topics, as the cluster describes them now; whether all were."""
        every: set[tuple[str, int]] = set()
        whole = True
        topics = admin.describe_topics(TopicCollection(self._topics), request_timeout=timeout_s)
        for topic, described in topics.items():
            try:
                partitions = self._answer(described, timeout_s).partitions
            except KafkaException:  # deleted meanwhile, or not answered: nothing of it to own
                whole = False
                continue
            every.update((topic, p.id) for p in partitions)
        return frozenset(every), whole

    def _answer(self, future: Future[T], timeout_s: float) -> T:
        """``future``'s result, waited for in slices; TimeoutError once stopped or past due."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                return future.result(timeout=_SLICE_S)
            except TimeoutError:
                if self._stopped.is_set() or time.monotonic() >= deadline:
                    raise

    def _nudge(self) -> None:
        """Join the group as a dynamic member, wait for its assignment, and leave."""
        config = consumer_config(
            self._settings, self._group, f"nudge-{uuid.uuid4().hex[:8]}", protocol="classic"
        )
        config.pop("group.instance.id", None)  # dynamic: its close leaves the group
        probe = _RawConsumer(config)
        assigned: list[bool] = []
        probe.subscribe(self._topics, on_assign=lambda _c, _parts: assigned.append(True))
        wait_ms = self._settings.session_timeout_ms + self._settings.request_timeout_ms
        deadline = time.monotonic() + wait_ms / 1000
        try:
            while not assigned and time.monotonic() < deadline and not self._stopped.is_set():
                probe.poll(_SLICE_S)  # a message fetched meanwhile is dropped, never committed
        finally:
            probe.close()
