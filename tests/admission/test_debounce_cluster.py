"""The debouncer on a 3-node Redis Cluster (deploy/local/redis-cluster.sh) while a slot migrates."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from support import require_service

from pipeline.admission.debounce import Debouncer
from pipeline.admission.debounce import keys as dk
from pipeline.envelope import Message
from pipeline.errors import DebounceUnavailable
from pipeline.topics.spec import DebouncePolicy

pytestmark = pytest.mark.redis
CLUSTER_PORT = 7000
PREFIX = "pltest"


@contextlib.asynccontextmanager
async def _moved(client: RedisCluster, slot: int, names: list[str]) -> AsyncIterator[Redis]:
    """Migrate ``slot`` to another primary and move ``names`` there; undone after (keys deleted).

    Yields a plain client on the slot's owner (the migrating node).
    """
    owner = client.nodes_manager.get_node_from_slot(slot)
    other = next(n for n in client.get_primaries() if n.name != owner.name)
    source, target = (
        Redis(host=owner.host, port=owner.port),
        Redis(host=other.host, port=other.port),
    )
    try:
        source_id = (await source.execute_command("CLUSTER", "MYID")).decode()
        target_id = (await target.execute_command("CLUSTER", "MYID")).decode()
        await target.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", source_id)
        await source.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", target_id)
        try:
            await source.execute_command(
                "MIGRATE", other.host, other.port, "", 0, 5000, "KEYS", *names
            )
            yield source
        finally:
            async with target.pipeline(transaction=False) as pipe:  # ASKING: the slot's importer
                pipe.execute_command("ASKING")
                pipe.delete(*names)
                await pipe.execute()
            for node in (target, source):
                await node.execute_command("CLUSTER", "SETSLOT", slot, "STABLE")
    finally:
        for c in (source, target):
            await c.aclose()


async def test_a_claim_during_a_slot_migration_leases_nothing(unique):
    """A claim or step refused while its lane's slot migrates leases no turn to nobody.

    ``db_claim`` and ``db_step`` declared only the lane's keys, so Redis ran them on the migrating
    node and stopped them at the first conversation already moved, after leasing the turns before
    it: those turns were returned to no runner, waited out their lease and came back with their
    attempt raised, as if they had run and never finished.
    """
    require_service("redis cluster (deploy/local/redis-cluster.sh)", "127.0.0.1", CLUSTER_PORT)
    client = RedisCluster.from_url(f"redis://127.0.0.1:{CLUSTER_PORT}")
    lane = f"mig{unique}"
    policy = DebouncePolicy(key="conversation_id", quiet_s=60, max_batch=1)  # due at once
    debouncer = Debouncer(client, PREFIX, lane, policy)
    state = dk.state_key(PREFIX, lane, "a")
    try:
        await debouncer.record("a", Message("chat", 0, 1, b"a", b"x", {}, 1_000))
        await debouncer.record("b", Message("chat", 0, 2, b"b", b"y", {}, 1_001))
        slot = await client.cluster_keyslot(dk.due_key(PREFIX, lane))
        moved = [dk.buffer_key(PREFIX, lane, "b"), dk.state_key(PREFIX, lane, "b")]
        async with _moved(client, slot, moved) as source:
            with pytest.raises(DebounceUnavailable):
                await debouncer.claim(10)
            assert await source.hget(state, "tok") is None  # "a" was not leased
            with pytest.raises(DebounceUnavailable):
                await debouncer.step(10)
            assert await source.hget(state, "tok") is None
        turns = (await debouncer.claim(10)).turns  # "b" went with its keys
        assert [(turn.key, turn.attempt) for turn in turns] == [("a", 1)]
    finally:
        async for key in client.scan_iter(match=f"{dk.lane_tag(PREFIX, lane)}*"):
            await client.delete(key)
        await client.aclose()


async def test_a_record_on_an_unreachable_cluster_is_unavailable(unique):
    """With no cluster node reachable, a record raises DebounceUnavailable (handled alone)."""
    client = RedisCluster.from_url("redis://127.0.0.1:1")
    debouncer = Debouncer(client, PREFIX, f"down{unique}", DebouncePolicy(key="c", quiet_s=1))
    with pytest.raises(DebounceUnavailable):
        await debouncer.record("a", Message("chat", 0, 1, b"a", b"x", {}, 1_000))
    assert debouncer.stats.fail_open == 1
    await client.aclose()
