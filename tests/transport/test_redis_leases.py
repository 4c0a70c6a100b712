"""Partition leases of the Redis Streams transport when members die and join between heartbeats.

The steps of the group protocol are driven one by one (the consumer's heartbeat is called
directly, other members are plain ``pl_heartbeat`` calls), so each interleaving is exact.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis
from support import delete_after_test

from pipeline.config import Settings
from pipeline.transport.protocol import TopicConfig
from pipeline.transport.redis_streams.consumer import RedisStreamsConsumer
from pipeline.transport.redis_streams.functions import Functions
from pipeline.transport.redis_streams.keys import Keys, partition_id
from pipeline.transport.redis_streams.transport import RedisStreamsTransport

pytestmark = pytest.mark.usefixtures("redis_service")

PARTITIONS = 4
LONG_MS = 60_000  # no background heartbeat or lease expiry interferes with the steps


@pytest.fixture
async def transport(settings: Settings) -> AsyncIterator[RedisStreamsTransport]:
    """A Redis Streams transport whose members renew rarely: the test drives the heartbeats."""
    redis = settings.redis.model_copy(update={"heartbeat_ms": LONG_MS, "lease_ms": LONG_MS})
    t = RedisStreamsTransport(settings.model_copy(update={"redis": redis}))
    yield t
    await t.close()


async def owners(client: Redis, keys: Keys, group: str) -> dict[str, str]:
    """Partition id -> owning member, from the group's lease hash."""
    raw = await client.hgetall(keys.owners(group))
    return {k.decode(): v.decode().split("|")[0] for k, v in raw.items()}


async def test_a_dead_members_partition_claimed_then_retargeted_is_released(
    transport: RedisStreamsTransport, redis: Redis, unique: str
) -> None:
    """A member claims a dead member's partitions, a newcomer joins before it took them up.

    The survivor's next heartbeat asks it to release what it claimed but never started; it must
    give those leases up, or it renews them forever and the newcomer never gets them.
    """
    topic, group = f"leases-{unique}", f"g-{unique}"
    delete_after_test(transport, [topic])
    await transport.admin().create_topic(TopicConfig(topic, PARTITIONS))
    keys = Keys(transport._settings.redis.key_prefix)
    functions = Functions(redis)
    pids = sorted(partition_id(topic, p) for p in range(PARTITIONS))
    members, leases = keys.members(group), keys.owners(group)

    # "m0-dead" held every partition and died: its leases have expired, it left no member entry.
    await redis.hset(leases, mapping=dict.fromkeys(pids, "m0-dead|0"))
    late = transport.consumer(group, [topic], member_id="m1-late")
    assert isinstance(late, RedisStreamsConsumer)
    try:
        await late._start()  # joins alone: its heartbeat claims all four before any poll
        assert set((await owners(redis, keys, group)).values()) == {"m1-late"}
        newcomer = await functions.heartbeat(members, leases, "m2-new", LONG_MS, pids)
        assert newcomer == ([], [])  # every lease is still m1-late's
        await late._heartbeat()  # now told to release the newcomer's half
        await late.poll(10, 0.01)

        held = await owners(redis, keys, group)
        assert sorted(held) == pids[0::2], "the newcomer's half is released, the rest is kept"
        assert set(held.values()) == {"m1-late"}
        owned, release = await functions.heartbeat(members, leases, "m2-new", LONG_MS, pids)
        assert (sorted(owned), release) == (pids[1::2], [])
        kept = sorted(partition_id(tp.topic, tp.partition) for tp in late.assignment())
        assert kept == pids[0::2]
    finally:
        await late.close()
