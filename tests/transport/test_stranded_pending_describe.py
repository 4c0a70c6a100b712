"""The strand watch never leaves librdkafka to time its description of the group out.

An admin request to a group coordinator that librdkafka times out while the coordinator's answer
is still outstanding, and that is answered afterwards, aborts the process in librdkafka
(``rd_kafka_enq_once_del_source_return``'s assertion; a broker paused past the session
timeout). The watch asks with a timeout far past any outage, waits for the answer only the
request timeout, and asks nothing more while that description is unanswered. The stand-in admin
is the watch's other collaborator: its descriptions are answered only when the test says so.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import ConsumerGroupState

from pipeline.config import KafkaSettings
from pipeline.transport.kafka.stranded import StrandWatch

TOPIC = "orders"


class Unanswered(Future[Any]):
    """A future the coordinator answers only when told; counts how often it is waited for."""

    def __init__(self) -> None:
        """Not answered yet, never waited for."""
        super().__init__()
        self.waits = 0
        self.on_wait: Callable[[], object] = lambda: None

    def result(self, timeout: float | None = None) -> Any:
        """Wait as a Future does, counted."""
        self.waits += 1
        self.on_wait()
        return super().result(timeout=timeout)


@dataclass
class SilentCoordinator:
    """describe_consumer_groups answered by futures that resolve only when the test says."""

    asked: list[Unanswered] = field(default_factory=list)
    timeouts: list[float] = field(default_factory=list)

    def describe_consumer_groups(self, groups: list[str], **kwargs: Any) -> dict[str, Any]:
        """A future nobody answers yet; the request timeout librdkafka was given is kept."""
        self.timeouts.append(kwargs["request_timeout"])
        future = Unanswered()
        self.asked.append(future)
        return {groups[0]: future}

    def describe_topics(self, topics: Any, **_: object) -> dict[str, Any]:
        """One partition a topic, answered at once."""
        described = SimpleNamespace(partitions=[SimpleNamespace(id=0)])
        return {t: SimpleNamespace(result=lambda **_: described) for t in topics.topic_names}


def _watch(coordinator: SilentCoordinator) -> tuple[StrandWatch, list[int]]:
    settings = KafkaSettings(session_timeout_ms=6000, request_timeout_ms=100)
    strand = StrandWatch(settings, "g", [TOPIC])
    strand._admin = coordinator  # the stand-in coordinator
    nudged: list[int] = []
    strand._nudge = lambda: nudged.append(1)  # type: ignore[method-assign]
    return strand, nudged


def _stable(*owned: int) -> Any:
    member = SimpleNamespace(
        assignment=SimpleNamespace(
            topic_partitions=[SimpleNamespace(topic=TOPIC, partition=p) for p in owned]
        )
    )
    return SimpleNamespace(state=ConsumerGroupState.STABLE, members=[member])


def test_an_unanswered_description_is_asked_once_and_never_timed_out_by_librdkafka(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """One description for many checks; the later ones do not wait; it is never cancelled."""
    coordinator = SilentCoordinator()
    strand, nudged = _watch(coordinator)
    caplog.set_level(logging.DEBUG, logger="pipeline.transport.kafka.stranded")
    for _ in range(5):
        assert strand.check() == frozenset()
    (future,) = coordinator.asked
    # Past any outage a member waits through: librdkafka's timeout never fires first.
    assert coordinator.timeouts == [600.0]
    waits = future.waits
    for _ in range(5):
        assert strand.check() == frozenset()
    assert future.waits == waits  # later checks return without waiting for it
    assert not future.cancelled()
    assert not nudged
    skipped = [r for r in caplog.records if "still unanswered" in r.getMessage()]
    assert len(skipped) == 1
    assert skipped[0].levelno == logging.DEBUG
    assert all(r.levelno <= logging.DEBUG for r in caplog.records)


def test_once_answered_the_next_check_asks_afresh() -> None:
    """The late answer is stale and dropped; the watch then checks as before, and nudges."""
    coordinator = SilentCoordinator()
    strand, nudged = _watch(coordinator)
    assert strand.check() == frozenset()
    coordinator.asked[0].set_result(_stable())  # answered late: nobody reads it
    fresh: list[Any] = [_stable(), _stable()]  # the partition unowned at two checks in a row

    def answered(groups: list[str], **kwargs: Any) -> dict[str, Any]:
        coordinator.timeouts.append(kwargs["request_timeout"])
        future: Future[Any] = Future()
        future.set_result(fresh.pop(0))
        return {groups[0]: future}

    coordinator.describe_consumer_groups = answered  # type: ignore[method-assign]
    assert strand.check() == frozenset()
    assert strand.check() == {(TOPIC, 0)}
    assert nudged == [1]
    assert coordinator.timeouts == [600.0, 600.0, 600.0]


def test_a_watch_stopped_while_waiting_ends_its_check_and_leaves_the_description_alone() -> None:
    """close() stops the watch while the coordinator is silent: the check ends, nothing cancelled.

    The request timeout is 5 min here: the check ends because the watch is stopped, not because
    its wait ran out (it would hang the test otherwise).
    """
    coordinator = SilentCoordinator()
    strand = StrandWatch(KafkaSettings(request_timeout_ms=300_000), "g", [TOPIC])
    strand._admin = coordinator  # the stand-in coordinator
    asking = coordinator.describe_consumer_groups

    def asked_then_closed(groups: list[str], **kwargs: Any) -> dict[str, Any]:
        futures = asking(groups, **kwargs)
        futures[groups[0]].on_wait = strand.stop  # the member closes while the check waits
        return futures

    coordinator.describe_consumer_groups = asked_then_closed  # type: ignore[method-assign]
    assert strand.check() == frozenset()
    (future,) = coordinator.asked
    assert not future.cancelled()
    assert not strand.due()
