"""How often the strand watch describes its topics while partitions stay unowned, on the broker.

confluent-kafka 2.16 leaks a ``Uuid`` per described topic, so the watch describes its topics at
its first check and then every 5 min, or sooner when the group's assignment disagrees with what
it knows. A disagreement that lasts (partitions of a topic no running member reads, or a
stranding the nudge did not end) was described again at every check; now it is described once,
and only a different disagreement is described again at once. Everything here is the real
broker and group, the nudges included; the admin client is the real one, wrapped only to count
its ``describe_topics`` calls.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from concurrent.futures import Future
from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import Consumer as RawConsumer
from confluent_kafka import ConsumerGroupState
from contract.helpers import make_topic
from support import delete_group_after

from pipeline.config import KafkaSettings, Settings
from pipeline.transport.kafka.group import admin_client, consumer_config
from pipeline.transport.kafka.stranded import StrandWatch
from pipeline.transport.protocol import Transport

PARTITIONS = 2
SETTLE_S = 60.0


class CountingAdmin:
    """The real admin client, counting the ``describe_topics`` calls made through it."""

    def __init__(self, admin: Any) -> None:
        """Count the calls made through ``admin``."""
        self._admin = admin
        self.described = 0

    def describe_consumer_groups(self, *args: Any, **kwargs: Any) -> Any:
        """The real client's answer."""
        return self._admin.describe_consumer_groups(*args, **kwargs)

    def describe_topics(self, *args: Any, **kwargs: Any) -> Any:
        """The real client's answer, counted."""
        self.described += 1
        return self._admin.describe_topics(*args, **kwargs)


class Member:
    """A dynamic classic member of ``group`` polled on its own thread; its topics can change."""

    def __init__(self, kafka: KafkaSettings, group: str, topics: list[str]) -> None:
        """Join ``group`` reading ``topics``, polled until :meth:`close`."""
        config = consumer_config(kafka, group, f"member-{uuid.uuid4().hex[:8]}")
        self._consumer = RawConsumer(config)
        self._wanted = topics
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="strand-member", daemon=True)
        self._thread.start()

    def subscribe(self, topics: list[str]) -> None:
        """Read ``topics`` from now on (the member joins again: the group rebalances)."""
        self._wanted = topics

    def close(self) -> None:
        """Leave the group."""
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        subscribed: list[str] = []
        try:
            while not self._stop.is_set():
                if self._wanted != subscribed:
                    subscribed = self._wanted
                    self._consumer.subscribe(subscribed)
                self._consumer.poll(0.1)
        finally:
            self._consumer.close()


def _settled(admin: Any, group: str, owned: set[str]) -> None:
    """Wait until the group is stable with one member, owning every partition of ``owned``."""
    deadline = time.monotonic() + SETTLE_S
    while True:
        described = admin.describe_consumer_groups([group])[group].result(timeout=10)
        held = [
            {(tp.topic, tp.partition) for tp in m.assignment.topic_partitions}
            for m in described.members
        ]
        wanted = {(topic, p) for topic in owned for p in range(PARTITIONS)}
        if described.state == ConsumerGroupState.STABLE and held == [wanted]:
            return
        assert time.monotonic() < deadline, (described.state, held)
        threading.Event().wait(0.2)  # the pace of asking, not a synchronisation


@pytest.fixture
def kafka_classic(settings: Settings) -> KafkaSettings:
    """Classic groups with a 6 s session: a check at most every 6 s (not waited for here)."""
    return settings.kafka.model_copy(
        update={"group_protocol": "classic", "session_timeout_ms": 6000}
    )


async def test_unowned_partitions_that_stay_so_are_described_once_per_disagreement(
    kafka: Transport,
    kafka_classic: KafkaSettings,
    unique: str,
) -> None:
    """The group's member stops reading the retry tier: its partitions stay unowned for good.

    The first check describes (nothing known yet), the agreeing one after it does not. The
    tier left unowned is a new disagreement, described at once; its second check still finds
    it and nudges (the nudge's member takes the tier and leaves: unowned again), and the checks
    after it, the same disagreement, describe nothing more. The member then reads only the tier:
    the main topic unowned is a different disagreement, described at once.
    """
    main, tier, group = f"strand_m_{unique}", f"strand_t_{unique}", f"g-strand-{unique}"
    await make_topic(kafka, main, PARTITIONS)
    await make_topic(kafka, tier, PARTITIONS)
    delete_group_after(kafka, group, [main, tier])
    admin = admin_client(kafka_classic)
    counting = CountingAdmin(admin_client(kafka_classic))
    watch = StrandWatch(kafka_classic, group, [main, tier])
    watch._admin = counting  # the real client, counted

    def check(owned: set[str]) -> tuple[frozenset[tuple[str, int]], int]:
        _settled(admin, group, owned)
        return watch.check(), counting.described

    def checks() -> list[tuple[frozenset[tuple[str, int]], int]]:
        seen = [check({main, tier}) for _ in range(2)]
        member.subscribe([main])
        seen += [check({main}) for _ in range(4)]
        member.subscribe([tier])
        return seen + [check({tier}) for _ in range(2)]

    member = Member(kafka_classic, group, [main, tier])
    try:
        seen = await asyncio.to_thread(checks)
    finally:
        watch.stop()
        await asyncio.to_thread(member.close)
    unowned_tier = {(tier, p) for p in range(PARTITIONS)}
    unowned_main = {(main, p) for p in range(PARTITIONS)}
    nothing: set[tuple[str, int]] = set()
    # The tier unowned at checks 3-6 (one disagreement), the main topic at checks 7-8.
    assert [set(nudged) for nudged, _ in seen] == [
        *(nothing, nothing),  # all owned
        *(nothing, unowned_tier) * 2,  # seen at two checks in a row: a nudge (it ends nothing)
        *(nothing, unowned_main),
    ]
    assert [described for _, described in seen] == [
        1,  # the first check: nothing known yet
        1,  # the assignment agrees
        2,  # the tier unowned: a new disagreement, described at once
        2,  # the same one: the nudge is decided on the kept description
        2,  # unowned again after the nudge: the same disagreement
        2,
        3,  # the main topic unowned instead: a different set, described at once
        3,
    ]


class _LaggingAdmin:
    """The admin client's two answers the watch reads, as a broker whose metadata lags gives them.

    A fake: a real single broker cannot answer a description from metadata older than its own.
    """

    def __init__(self) -> None:
        self.owned: set[int] = set()
        self.partitions = 2
        self.described = 0

    def describe_consumer_groups(self, groups: list[str], request_timeout: float) -> Any:  # noqa: ARG002
        assignment = SimpleNamespace(
            topic_partitions=[SimpleNamespace(topic="t", partition=p) for p in sorted(self.owned)]
        )
        group = SimpleNamespace(
            state=ConsumerGroupState.STABLE, members=[SimpleNamespace(assignment=assignment)]
        )
        return {groups[0]: _done(group)}

    def describe_topics(self, topics: Any, request_timeout: float) -> Any:  # noqa: ARG002
        self.described += 1
        ids = [SimpleNamespace(id=p) for p in range(self.partitions)]
        return {"t": _done(SimpleNamespace(partitions=ids))}


def _done(value: object) -> Future[object]:
    future: Future[object] = Future()
    future.set_result(value)
    return future


def test_partitions_owned_but_not_yet_described_are_asked_for_until_known() -> None:
    """A grown topic described by a lagging broker is described again until it names them.

    Kept as a confirmed disagreement, partitions 2 and 3 stayed unknown for 5 minutes, and
    then, left to no member, went unseen: neither unowned nor unknown.
    """
    watch = StrandWatch(Settings().kafka, "g", ["t"])
    admin = _LaggingAdmin()
    watch._admin = admin
    admin.owned = {0, 1}
    assert watch._unowned() == frozenset()
    admin.owned = {0, 1, 2, 3}  # the topic grew; the description still says 2
    assert watch._unowned() == frozenset()
    admin.partitions = 4  # the broker's metadata caught up
    assert watch._unowned() == frozenset()
    admin.owned = {0, 1}  # 2 and 3 left to no member
    assert watch._unowned() == {("t", 2), ("t", 3)}
    described = admin.described
    assert watch._unowned() == {("t", 2), ("t", 3)}
    assert admin.described == described  # the same unowned set is not described again
