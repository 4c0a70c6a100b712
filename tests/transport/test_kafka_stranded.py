"""The strand watch's decisions: when partitions owned by no member make it nudge the group.

The coordinator's answers come from a stand-in admin and the nudge is recorded instead of
joining; the whole path on the real broker is
``test_kafka_membership.py::test_partitions_a_dead_member_left_mid_rebalance_are_given_out``.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import ConsumerGroupState, KafkaException

from pipeline.config import KafkaSettings
from pipeline.testing.ports import free_port
from pipeline.transport.kafka.stranded import StrandWatch

TOPIC = "orders"


@dataclass
class Coordinator:
    """Answers describe_consumer_groups and list_topics from ``owned`` (member -> partitions)."""

    owned: dict[str, list[int]]
    state: Any = ConsumerGroupState.STABLE
    failing: Exception | None = None
    partitions: int = 4
    asked: list[str] = field(default_factory=list)

    def describe_consumer_groups(self, groups: list[str], **_: object) -> dict[str, Any]:
        """The group's state and its members' assignments, as futures."""
        self.asked.append("describe")
        if self.failing is not None:
            raise self.failing
        members = [
            SimpleNamespace(
                assignment=SimpleNamespace(
                    topic_partitions=[SimpleNamespace(topic=TOPIC, partition=p) for p in parts]
                )
            )
            for parts in self.owned.values()
        ]
        answer = SimpleNamespace(state=self.state, members=members)
        return {groups[0]: SimpleNamespace(result=lambda **_: answer)}

    def describe_topics(self, topics: Any, **_: object) -> dict[str, Any]:
        """Each topic's description, as futures: ``partitions`` partitions."""
        described = SimpleNamespace(
            partitions=[SimpleNamespace(id=p) for p in range(self.partitions)]
        )
        return {t: SimpleNamespace(result=lambda **_: described) for t in topics.topic_names}


@pytest.fixture
def watch() -> tuple[StrandWatch, Coordinator, list[int]]:
    """A watch whose checks ask a stand-in coordinator and whose nudges are counted."""
    coordinator = Coordinator({"a": [0, 1, 2, 3], "b": []})
    strand = StrandWatch(KafkaSettings(session_timeout_ms=6000), "g", [TOPIC])
    strand._admin = coordinator  # the stand-in coordinator
    nudged: list[int] = []
    strand._nudge = lambda: nudged.append(1)  # type: ignore[method-assign]
    return strand, coordinator, nudged


def test_partitions_unowned_at_two_checks_in_a_row_nudge_once(
    watch: tuple[StrandWatch, Coordinator, list[int]],
) -> None:
    """Seen once (a rebalance's first half), nothing; still unowned at the next check, a nudge."""
    strand, coordinator, nudged = watch
    assert strand.check() == frozenset()
    coordinator.owned = {"a": [2, 3], "b": []}
    assert strand.check() == frozenset()
    assert not nudged
    assert strand.check() == {(TOPIC, 0), (TOPIC, 1)}
    assert nudged == [1]
    assert strand.check() == frozenset()  # the nudge's rebalances are given a check's time
    assert nudged == [1]


def test_partitions_given_out_between_checks_are_not_nudged_for(
    watch: tuple[StrandWatch, Coordinator, list[int]],
) -> None:
    """Only partitions unowned at both checks count: a second half that came is no stranding."""
    strand, coordinator, nudged = watch
    coordinator.owned = {"a": [2, 3], "b": []}
    strand.check()
    coordinator.owned = {"a": [2, 3], "b": [0, 1]}
    assert strand.check() == frozenset()
    coordinator.owned = {"a": [2], "b": [0, 1]}  # another rebalance's first half
    assert strand.check() == frozenset()
    assert not nudged


def test_a_group_that_is_rebalancing_or_unreadable_is_left_alone(
    watch: tuple[StrandWatch, Coordinator, list[int]],
) -> None:
    """Unowned partitions of a group in a rebalance, or a failed describe, reset the count."""
    strand, coordinator, nudged = watch
    coordinator.owned = {"a": [2, 3], "b": []}
    coordinator.state = ConsumerGroupState.PREPARING_REBALANCING
    strand.check()
    strand.check()
    coordinator.state = ConsumerGroupState.STABLE
    strand.check()
    coordinator.failing = KafkaException("coordinator not available")
    assert strand.check() == frozenset()
    coordinator.failing = None
    strand.check()
    coordinator.failing = TimeoutError()  # the future's answer did not come in time
    assert strand.check() == frozenset()
    coordinator.failing = None
    assert strand.check() == frozenset()
    assert not nudged
    assert coordinator.asked.count("describe") == 7


def test_checks_are_due_once_a_session_timeout_apart() -> None:
    """A check is due a session timeout after the last one, never sooner than 5 s."""
    assert StrandWatch(KafkaSettings(session_timeout_ms=6000), "g", [TOPIC]).interval_s == 6.0
    assert StrandWatch(KafkaSettings(session_timeout_ms=3000), "g", [TOPIC]).interval_s == 5.0
    strand = StrandWatch(KafkaSettings(session_timeout_ms=6000), "g", [TOPIC])
    assert not strand.due()


async def test_a_nudge_under_way_leaves_when_the_watch_stops() -> None:
    """A consumer that closes stops its watch, and a nudge in progress ends with it.

    The nudging member's join cannot complete while the broker is unreachable (here: nothing
    listens on its port), so unstopped it would wait a session plus a request timeout (36 s);
    stopped, it leaves at its next poll.
    """
    kafka = KafkaSettings(
        bootstrap_servers=f"127.0.0.1:{free_port()}",
        group_protocol="classic",
        session_timeout_ms=6000,
        request_timeout_ms=30000,
    )
    strand = StrandWatch(kafka, "g", [TOPIC])
    nudging = asyncio.create_task(asyncio.to_thread(strand._nudge))
    strand.stop()
    await asyncio.wait_for(nudging, 15)
    assert not strand.due()
    assert strand.check() == frozenset()  # asks nobody once stopped


def test_a_check_waiting_for_the_coordinator_gives_up_when_the_watch_stops(
    watch: tuple[StrandWatch, Coordinator, list[int]],
) -> None:
    """An answer that does not come (the broker unreachable) is waited for only until a stop."""
    strand, coordinator, nudged = watch
    waited: list[float] = []

    def unanswered(timeout: float) -> Any:
        waited.append(timeout)
        if len(waited) == 3:
            strand.stop()  # the consumer closes meanwhile
        raise TimeoutError

    never = SimpleNamespace(result=unanswered)
    coordinator.describe_consumer_groups = lambda groups, **_: {groups[0]: never}  # type: ignore[method-assign]
    assert strand.check() == frozenset()
    assert waited == [0.1, 0.1, 0.1]  # not the request timeout (30 s) in one wait
    assert not nudged
