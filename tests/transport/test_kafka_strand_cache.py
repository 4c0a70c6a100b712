"""The strand watch's kept description of its topics: when it is asked for again.

The watch describes its topics at its first check and then only every 5 min, or sooner when the
group's assignment disagrees with what it knows (confluent-kafka 2.16 leaks a ``Uuid`` per
described topic). A description it could not complete is no description to keep, and
partitions of topics it does not watch say nothing about its own. The coordinator is a stand-in
admin and the nudge is recorded instead of joining, as in ``test_kafka_stranded.py``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from confluent_kafka import ConsumerGroupState, KafkaException

from pipeline.config import KafkaSettings
from pipeline.transport.kafka.stranded import StrandWatch

MAIN, TIER = "orders", "orders.retry.5s"


def _future(answer: Any = None, error: Exception | None = None) -> Any:
    """A future already answered with ``answer``, or failed with ``error``."""

    def result(**_: object) -> Any:
        if error is not None:
            raise error
        return answer

    return SimpleNamespace(result=result)


@dataclass
class Coordinator:
    """A stable group whose members own ``owned``; topics of ``partitions`` partitions each."""

    owned: list[tuple[str, int]]
    partitions: int = 2
    failing: set[str] = field(default_factory=set)
    """Topics whose description fails (a timeout, a broker restarting)."""
    described: int = 0

    def describe_consumer_groups(self, groups: list[str], **_: object) -> dict[str, Any]:
        """One member owning ``owned``."""
        tps = [SimpleNamespace(topic=t, partition=p) for t, p in self.owned]
        member = SimpleNamespace(assignment=SimpleNamespace(topic_partitions=tps))
        answer = SimpleNamespace(state=ConsumerGroupState.STABLE, members=[member])
        return {groups[0]: _future(answer)}

    def describe_topics(self, topics: Any, **_: object) -> dict[str, Any]:
        """Each topic's partitions, or its failure."""
        self.described += 1
        described = SimpleNamespace(
            partitions=[SimpleNamespace(id=p) for p in range(self.partitions)]
        )
        failed = KafkaException("timed out")
        return {
            t: _future(error=failed) if t in self.failing else _future(described)
            for t in topics.topic_names
        }


def _watch(coordinator: Coordinator) -> tuple[StrandWatch, list[int]]:
    strand = StrandWatch(KafkaSettings(session_timeout_ms=6000), "g", [MAIN, TIER])
    strand._admin = coordinator  # the stand-in coordinator
    nudged: list[int] = []
    strand._nudge = lambda: nudged.append(1)  # type: ignore[method-assign]
    return strand, nudged


def test_a_topic_whose_description_failed_is_described_again_at_the_next_check() -> None:
    """The retry tier could not be described once; its partitions left to nobody are still found.

    Kept for 5 min without the tier, the watch would not see them (its main topic's partitions,
    all owned, give no reason to ask again) and a stranded tier would wait that long.
    """
    coordinator = Coordinator(owned=[(MAIN, 0), (MAIN, 1)], failing={TIER})
    strand, nudged = _watch(coordinator)
    assert strand.check() == frozenset()
    coordinator.failing.clear()
    assert strand.check() == frozenset()  # seen unowned once
    assert strand.check() == {(TIER, 0), (TIER, 1)}
    assert nudged == [1]


def test_partitions_of_topics_it_does_not_watch_do_not_make_it_describe_again() -> None:
    """A member of the group that also consumes another lane's topic: one description, kept."""
    coordinator = Coordinator(
        owned=[(MAIN, 0), (MAIN, 1), (TIER, 0), (TIER, 1), ("other_lane", 0), ("other_lane", 1)]
    )
    strand, nudged = _watch(coordinator)
    for _ in range(5):
        assert strand.check() == frozenset()
    assert coordinator.described == 1
    assert not nudged


def test_a_topic_grown_under_the_group_is_described_again() -> None:
    """Its new partitions owned by a member: described again, and nothing is unowned."""
    coordinator = Coordinator(owned=[(MAIN, 0), (MAIN, 1), (TIER, 0), (TIER, 1)])
    strand, nudged = _watch(coordinator)
    assert strand.check() == frozenset()
    coordinator.owned.append((MAIN, 2))
    assert strand.check() == frozenset()
    assert coordinator.described == 2
    assert not nudged
