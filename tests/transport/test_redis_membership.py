"""Named Redis Streams members on the real server: a restart under the same name moves nothing."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Literal

import pytest
from contract.helpers import RecordingListener, make_topic

from pipeline.config import Settings
from pipeline.envelope import Position, TopicPartition
from pipeline.transport.redis_streams.consumer import RedisStreamsConsumer
from pipeline.transport.redis_streams.keys import partition_id
from pipeline.transport.redis_streams.transport import RedisStreamsTransport

pytestmark = pytest.mark.usefixtures("redis_service")
PARTITIONS = 6
LEASE_MS = 30_000  # long: a partition that moves within a test moved because of its name
MEMBER = Path(__file__).with_name("member_proc.py")


@pytest.fixture
async def transport(settings: Settings) -> AsyncIterator[RedisStreamsTransport]:
    """A Redis Streams transport with a long lease (heartbeats stay fast)."""
    redis = settings.redis.model_copy(update={"lease_ms": LEASE_MS})
    t = RedisStreamsTransport(settings.model_copy(update={"redis": redis}))
    yield t
    await t.close()


def named(
    base: RedisStreamsTransport, settings: Settings, name: str, shutdown: Literal["hold", "leave"]
) -> RedisStreamsTransport:
    """A transport sharing ``base``'s client whose members are called ``name``."""
    membership = settings.membership.model_copy(update={"instance": name, "shutdown": shutdown})
    redis = settings.redis.model_copy(update={"lease_ms": LEASE_MS})
    t = RedisStreamsTransport(
        settings.model_copy(update={"membership": membership, "redis": redis})
    )
    t.client = base.client
    t._functions = base._functions  # share the loaded library and connections
    return t


async def until_owning(consumer: RedisStreamsConsumer, count: int, timeout_s: float = 30) -> None:
    """Poll until the member owns ``count`` partitions."""
    deadline = time.monotonic() + timeout_s
    while len(consumer.assignment()) != count:
        assert time.monotonic() < deadline, f"owns {consumer.assignment()} after {timeout_s}s"
        await consumer.poll(100, 0.1)


async def two_members(
    transport: RedisStreamsTransport,
    settings: Settings,
    unique: str,
    shutdown: Literal["hold", "leave"],
) -> tuple[str, RedisStreamsConsumer, RedisStreamsConsumer, RecordingListener]:
    """A topic and two named members sharing its partitions; the second one's listener."""
    topic = f"rmember_{unique}"
    await make_topic(transport, topic, PARTITIONS)
    group = f"g-{unique}"
    a = named(transport, settings, f"{unique}-a", shutdown).consumer(group, [topic])
    b_listener = RecordingListener()
    b = named(transport, settings, f"{unique}-b", shutdown).consumer(
        group, [topic], listener=b_listener
    )
    await until_owning(a, PARTITIONS)
    await asyncio.gather(until_owning(a, PARTITIONS // 2), until_owning(b, PARTITIONS // 2))
    return topic, a, b, b_listener


async def lease_to(
    transport: RedisStreamsTransport,
    member: RedisStreamsConsumer,
    tp: TopicPartition,
    holder: RedisStreamsConsumer,
) -> None:
    """Give ``holder`` the lease of ``member``'s partition ``tp``, as after ``member`` stalled."""
    far = int(time.time() * 1000) + LEASE_MS
    owners = member._keys.owners(member._group)
    await transport.client.hset(
        owners, partition_id(tp.topic, tp.partition), f"{holder.member_id}|{far}"
    )


async def test_a_member_restarted_under_its_name_holds_its_partitions(
    transport: RedisStreamsTransport, settings: Settings, unique: str
) -> None:
    """shutdown=hold: a stopped member's replacement takes its partitions; the other keeps its."""
    topic, a, b, b_listener = await two_members(transport, settings, unique, "hold")
    a_owned, b_owned = a.assignment(), b.assignment()
    revoked_before = list(b_listener.revoked)
    await a.close()
    again = named(transport, settings, f"{unique}-a", "hold").consumer(f"g-{unique}", [topic])
    try:
        await until_owning(again, PARTITIONS // 2)
        await b.poll(10, 0.3)
        assert again.assignment() == a_owned
        assert b.assignment() == b_owned
        assert b_listener.revoked == revoked_before
        assert b_listener.assigned == sorted(b_owned)
    finally:
        await again.close()
        await b.close()


async def test_a_leaving_member_hands_its_partitions_over_at_once(
    transport: RedisStreamsTransport, settings: Settings, unique: str
) -> None:
    """With shutdown=leave a stopped member's partitions go to the other member without waiting."""
    _, a, b, _ = await two_members(transport, settings, unique, "leave")
    await a.close()
    try:
        await until_owning(b, PARTITIONS)  # long before the 30 s lease would have run out
    finally:
        await b.close()


async def test_a_killed_member_replaced_under_its_name_redelivers_its_pending_entries(
    transport: RedisStreamsTransport, settings: Settings, unique: str
) -> None:
    """A kill -9'd member's namesake replacement reclaims its unacknowledged entries in order."""
    topic = f"rmember_{unique}"
    await make_topic(transport, topic, PARTITIONS)
    producer = transport.producer()
    for i in range(30):
        await producer.send(topic, f"v{i}".encode(), key=f"k{i % 7}".encode())
    await producer.close()
    group = f"g-{unique}"
    env = {**os.environ, "PIPELINE_REDIS__LEASE_MS": str(LEASE_MS)}
    args = [str(MEMBER), "redis", group, topic, f"{unique}-a", str(PARTITIONS)]
    dead = await asyncio.create_subprocess_exec(
        sys.executable, *args, stdout=subprocess.PIPE, env=env
    )
    try:
        assert dead.stdout is not None
        line = await asyncio.wait_for(dead.stdout.readline(), 60)
        assert line.startswith(b"owned "), line
    finally:
        dead.kill()
        await dead.wait()
    replacement = named(transport, settings, f"{unique}-a", "hold").consumer(group, [topic])
    try:
        received = []
        deadline = time.monotonic() + 30
        while len(received) < 30:
            assert time.monotonic() < deadline, f"got {len(received)} of 30"
            received += await replacement.poll(100, 0.2)
        by_partition: dict[int, list[int]] = {}
        for message in received:
            by_partition.setdefault(message.partition, []).append(message.offset)
        assert all(offsets == sorted(offsets) for offsets in by_partition.values())
        assert sorted(int(m.value[1:]) for m in received) == list(range(30))
        assert any(m.delivery_count > 1 for m in received)
    finally:
        await replacement.close()


async def test_a_rejoining_member_gives_up_what_another_member_holds_now(
    transport: RedisStreamsTransport, settings: Settings, unique: str
) -> None:
    """``rejoin``: every partition revoked as lost, then those whose lease is still B's come back.

    The lease of one of B's partitions is A's now, as after B stalled past its lease: B's
    rejoin finds it at once, without waiting for its next heartbeat, and it stays revoked.
    """
    _, a, b, b_listener = await two_members(transport, settings, unique, "leave")
    try:
        owned = sorted(b.assignment())
        await b.rejoin()
        await b.poll(10, 0.1)
        assert b_listener.revoked == [(tp, True) for tp in owned]
        assert b_listener.assigned == owned + owned
        assert sorted(b.assignment()) == owned
        b_listener.revoked.clear()
        taken = owned[0]
        await lease_to(transport, b, taken, a)
        await b.rejoin()
        await b.poll(10, 0.1)
        assert b_listener.revoked == [(tp, True) for tp in owned]
        assert sorted(b.assignment()) == owned[1:]
    finally:
        await a.close()
        await b.close()


async def test_a_member_whose_partition_was_taken_over_commits_nothing_of_it(
    transport: RedisStreamsTransport, settings: Settings, unique: str
) -> None:
    """A stalled member's commit neither moves a taken partition's position nor acks its entries.

    B's lease of one partition is A's now and A has committed further; B, not knowing, commits
    an older position: A's stays, B's other partitions are committed, and B's next poll
    revokes the taken one as lost.
    """
    _, a, b, b_listener = await two_members(transport, settings, unique, "leave")
    try:
        owned = sorted(b.assignment())
        taken, kept = owned[0], owned[1]
        await lease_to(transport, b, taken, a)
        await transport.client.hset(
            b._keys.positions(f"g-{unique}"), partition_id(taken.topic, taken.partition), 7
        )
        await b.commit([Position(taken, 3), Position(kept, 2)])
        stored = await b.committed([taken, kept])
        assert stored[taken].offset == 7  # A's, not moved back
        assert stored[kept].offset == 2
        await b.poll(10, 0.1)
        assert b_listener.revoked == [(taken, True)]
        assert taken not in b.assignment()
    finally:
        await a.close()
        await b.close()


async def test_a_member_stalled_past_its_lease_reads_nothing_of_a_partition_taken_meanwhile(
    transport: RedisStreamsTransport, settings: Settings, unique: str
) -> None:
    """Back from a stall, B asks about its leases before it reads anything.

    The taken partition's new entry goes to A, its owner now, not into B's pending list.
    Before, B's first poll read the entry (its heartbeat had not run yet), where A, which had
    taken the partition over before it arrived, never looked: the entry was never handled.
    """
    topic, a, b, b_listener = await two_members(transport, settings, unique, "leave")
    try:
        assert b._heartbeat_task is not None
        b._heartbeat_task.cancel()  # B is stalled: its heartbeats do not run
        taken = min(b.assignment())
        await lease_to(transport, b, taken, a)
        b._last_renewed = time.monotonic() - LEASE_MS / 1000  # its last renewal a lease ago
        producer = transport.producer()
        await producer.send(topic, b"after", partition=taken.partition)
        read = await b.poll(10, 0.1)
        assert [m for m in read if m.tp == taken] == []
        assert b_listener.revoked == [(taken, True)]
        stream = b._keys.stream(taken.topic, taken.partition)
        pending = await transport.client.xpending(stream, f"g-{unique}")
        assert pending["pending"] == 0  # in nobody's pending list: still to be delivered
        await b.close()  # B leaves: A, whose lease it is, takes the partition up for good
        deadline = time.monotonic() + 30
        got: list[bytes] = []
        while not got:
            assert time.monotonic() < deadline, a.assignment()
            got = [m.value for m in await a.poll(10, 0.1) if m.tp == taken]
        assert got == [b"after"]
    finally:
        await a.close()
        await b.close()


async def test_a_member_that_left_leaves_no_consumer_behind_once_its_entries_are_claimed(
    transport: RedisStreamsTransport, settings: Settings, unique: str
) -> None:
    """A's delivered but unfinished entries go to B; then A's consumers are gone from each stream.

    Before, every member that ever read a stream stayed one of its group's consumers: a crash
    loop or a day of rolling deploys under fresh names added one per start and stream, forever.
    """
    topic, a, b, _ = await two_members(transport, settings, unique, "leave")
    producer = transport.producer()
    for i in range(24):
        await producer.send(topic, f"v{i}".encode(), key=f"k{i}".encode())
    await producer.close()
    taken: list[int] = []
    while len(taken) < 12:  # A's half, delivered and never committed
        taken += [m.partition for m in await a.poll(100, 0.2)]
    await a.close()
    received = []
    deadline = time.monotonic() + 30
    while len(received) < 24:
        assert time.monotonic() < deadline, f"got {len(received)} of 24"
        received += await b.poll(100, 0.2)
    try:
        for p in range(PARTITIONS):
            stream = b._keys.stream(topic, p)
            consumers = await transport.client.xinfo_consumers(stream, b._group)
            assert [c["name"] for c in consumers] == [b.member_id.encode()]
        assert sorted(int(m.value[1:]) for m in received) == list(range(24))
    finally:
        await b.close()
