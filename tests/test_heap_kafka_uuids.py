"""Asking the broker about named topics leaves nothing behind in a long-running process.

confluent-kafka 2.16's ``describe_topics`` leaks the ``Uuid`` it builds for each described
topic's id (one reference too many, never released): ``pipeline consume`` grew by one for every
topic its strand watch and its metrics refresher asked about, some 30 every 100 s. The topics'
partitions are read from their metadata instead, and the strand watch asks for them again only
now and then.
"""

from __future__ import annotations

import asyncio
import gc
import time

from confluent_kafka import Consumer as RawConsumer
from confluent_kafka import Uuid
from contract.helpers import make_topic

from pipeline.config import Settings
from pipeline.transport.kafka.stranded import StrandWatch
from pipeline.transport.protocol import Transport

CALLS = 20


def _uuids() -> int:
    """``Uuid`` objects alive in this process."""
    gc.collect()
    return sum(1 for o in gc.get_objects() if type(o) is Uuid)


async def test_listing_named_topics_again_and_again_keeps_no_uuid(
    kafka: Transport, unique: str
) -> None:
    """The metrics refresher's question (named topics, with partitions and counts) leaves none."""
    admin = kafka.admin()
    names = [f"uuid_a_{unique}", f"uuid_b_{unique}"]
    for name in names:
        await make_topic(kafka, name, 2)
    assert set(await admin.list_topics(names)) == set(names)
    before = _uuids()
    for _ in range(CALLS):
        listed = await admin.list_topics([*names, f"missing_{unique}"])
        assert {n: i.partitions for n, i in listed.items()} == dict.fromkeys(names, 2)
    assert _uuids() - before == 0


async def test_strand_checks_of_a_stable_group_keep_no_uuid_per_check(
    settings: Settings, kafka: Transport, unique: str
) -> None:
    """Checks of a stable group's partitions describe its topics once, not at every check."""
    topic, group = f"uuid_s_{unique}", f"g-uuid-{unique}"
    await make_topic(kafka, topic, 2)
    member = RawConsumer({"bootstrap.servers": settings.kafka.bootstrap_servers, "group.id": group})
    assigned: list[bool] = []
    member.subscribe([topic], on_assign=lambda _c, _p: assigned.append(True))
    watch = StrandWatch(settings.kafka, group, [topic])
    try:
        deadline = time.monotonic() + 30
        while not assigned:  # joined and assigned: the group turns stable
            assert time.monotonic() < deadline, "the member was never assigned"
            await asyncio.to_thread(member.poll, 0.2)
        while watch._described_s == float("-inf"):  # described once seen stable: one Uuid
            assert time.monotonic() < deadline, "the group was never seen stable"
            assert await asyncio.to_thread(watch.check) == frozenset()
        before = _uuids()
        for _ in range(CALLS):
            assert await asyncio.to_thread(watch.check) == frozenset()
        assert _uuids() - before == 0
    finally:
        watch.stop()
        await asyncio.to_thread(member.close)
        await kafka.admin().delete_group(group, [topic])
