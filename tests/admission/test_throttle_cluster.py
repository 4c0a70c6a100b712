"""The throttle's key layout on a 3-node Redis Cluster (deploy/local/redis-cluster.sh)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest
from redis import exceptions as rexc
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from runtime.helpers import eventually
from support import require_service

from pipeline.admission import keys as k
from pipeline.admission.functions import ThrottleFunctions
from pipeline.admission.throttle import Throttle

pytestmark = pytest.mark.redis
CLUSTER_PORT = 7000


async def _delete_namespace(client: RedisCluster, prefix: str, namespace: str) -> None:
    """Delete every key of a throttle namespace (the test's own, named with its suffix)."""
    async for key in client.scan_iter(match=f"{k.tag(prefix, namespace)}*"):
        await client.delete(key)


async def test_multi_key_acquire_and_handover_on_cluster(unique):
    """Multi-key acquisition, hand-over and wake work across the cluster's nodes."""
    require_service("redis cluster (deploy/local/redis-cluster.sh)", "127.0.0.1", CLUSTER_PORT)
    url = f"redis://127.0.0.1:{CLUSTER_PORT}"
    clients = [RedisCluster.from_url(url) for _ in range(4)]
    namespaces = [f"a{unique}", f"b{unique}"]
    throttles = []
    try:
        for i, ns in enumerate(namespaces):
            wake = clients[2 * i + 1]
            t = Throttle(clients[2 * i], namespace=ns, default_limit=1, wake_client=wake)
            await t.start()
            throttles.append(t)
        slots = {await clients[0].cluster_keyslot(k.meta("pl", ns)) for ns in namespaces}
        assert len(slots) == 2  # namespaces spread over slots; one namespace is one slot
        for t in throttles:
            keys = ["org:acme", "sub:acme/t42", "job:doc-17"]
            held = await t.acquire(keys)
            waiting = asyncio.create_task(t.acquire(["job:doc-17", "org:acme"], priority=3))
            await eventually(lambda t=t: t.waited == 1, 10)
            status = await t.status("job:doc-17")  # the first of its keys in canonical order
            assert status.waiters_by_priority() == {3: 1}
            await t.release(held)
            permit = await asyncio.wait_for(waiting, 10)
            assert t.wakes == 1
            await t.release(permit)
            assert (await t.status("job:doc-17")).holders == ()
    finally:
        for t in throttles:
            await t.close()
        for ns in namespaces:
            await _delete_namespace(clients[0], "pl", ns)
        for c in clients[::2]:
            await c.aclose()


def _owner_and_other(client: RedisCluster, slot: int) -> tuple[Redis, Redis]:
    """Plain clients on the primary serving ``slot`` and on another primary."""
    owner = client.nodes_manager.get_node_from_slot(slot)
    other = next(n for n in client.get_primaries() if n.name != owner.name)
    return Redis(host=owner.host, port=owner.port), Redis(host=other.host, port=other.port)


async def test_a_call_during_a_slot_migration_changes_nothing(unique):
    """A throttle call refused while its slot migrates leaves no half-done change behind.

    The functions declared only ``T:meta``, so Redis ran them on the migrating node and stopped
    one at the first key missing there: a lapsed holder was already removed from the key when
    its hand-over failed, and the waiter it was owed never got the free slot, after the
    migration as well.
    """
    require_service("redis cluster (deploy/local/redis-cluster.sh)", "127.0.0.1", CLUSTER_PORT)
    client = RedisCluster.from_url(f"redis://127.0.0.1:{CLUSTER_PORT}")
    namespace = f"mig{unique}"
    dead = ThrottleFunctions(client, "pltest", namespace, member="dead", default_limit=1)
    alive = ThrottleFunctions(client, "pltest", namespace, member="alive", default_limit=1)
    slot = await client.cluster_keyslot(k.meta("pltest", namespace))
    source, target = _owner_and_other(client, slot)
    try:
        assert (await dead.acquire("held", 0, 60_000, ["org:a"], try_only=False)).state == "granted"
        assert (
            await alive.acquire("owed", 0, 60_000, ["org:a"], try_only=False)
        ).state == "waiting"
        await client.zadd(k.leases("pltest", namespace), {"held": 1})  # its member died long ago
        source_id = (await source.execute_command("CLUSTER", "MYID")).decode()
        target_id = (await target.execute_command("CLUSTER", "MYID")).decode()
        await target.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", source_id)
        await source.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", target_id)
        try:
            with pytest.raises(rexc.RedisError):  # refused while the slot migrates
                await alive.renew(["owed"])
        finally:
            for node in (target, source):
                await node.execute_command("CLUSTER", "SETSLOT", slot, "STABLE")
        assert (await alive.renew(["owed"])).letters == "g"  # the lapsed slot went to the waiter
    finally:
        await _delete_namespace(client, "pltest", namespace)
        for c in (source, target):
            await c.aclose()
        await client.aclose()


@contextlib.asynccontextmanager
async def _migrating(source: Redis, target: Redis, slot: int) -> AsyncIterator[None]:
    """Put ``slot`` into the migrating state from ``source`` to ``target``; stable again after."""
    source_id = (await source.execute_command("CLUSTER", "MYID")).decode()
    target_id = (await target.execute_command("CLUSTER", "MYID")).decode()
    await target.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", source_id)
    await source.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", target_id)
    try:
        yield
    finally:
        for node in (target, source):
            await node.execute_command("CLUSTER", "SETSLOT", slot, "STABLE")


async def test_an_acquisition_during_a_slot_migration_fails_open(unique, caplog):
    """An acquisition refused while its slot migrates is admitted unconditionally, in one line."""
    require_service("redis cluster (deploy/local/redis-cluster.sh)", "127.0.0.1", CLUSTER_PORT)
    client = RedisCluster.from_url(f"redis://127.0.0.1:{CLUSTER_PORT}")
    namespace = f"mfo{unique}"
    throttle = Throttle(
        client,
        prefix="pltest",
        namespace=namespace,
        default_limit=1,
        wake_client=RedisCluster.from_url(f"redis://127.0.0.1:{CLUSTER_PORT}"),
    )
    await throttle.start()
    slot = await client.cluster_keyslot(k.meta("pltest", namespace))
    source, target = _owner_and_other(client, slot)
    try:
        await throttle.release(await throttle.acquire(["org:a"]))  # the namespace's keys exist
        caplog.clear()
        async with _migrating(source, target, slot):
            waited = await throttle.acquire(["org:a"])
            tried = await throttle.try_acquire(["org:a"])
        assert waited.unconditional
        assert tried is not None
        assert tried.unconditional
        assert throttle.fail_open == 2
        warnings = [r for r in caplog.records if r.name == "pipeline.admission.throttle"]
        assert [r.exc_info for r in warnings] == [None, None]
        assert all("admitting ['org:a'] without it" in r.getMessage() for r in warnings)
    finally:
        await throttle.close()
        await _delete_namespace(client, "pltest", namespace)
        for c in (source, target):
            await c.aclose()
        await client.aclose()


async def test_fails_open_when_the_cluster_is_unreachable(unique):
    """With no cluster node reachable, the throttle starts, admits unconditionally and closes."""
    url = "redis://127.0.0.1:1"
    throttle = Throttle(
        RedisCluster.from_url(url),
        namespace=f"t{unique}",
        wake_block_s=0.2,
        wake_client=RedisCluster.from_url(url),
    )
    await throttle.start()
    permit = await throttle.acquire(["org:a"])
    assert permit.unconditional
    assert throttle.fail_open == 1
    await throttle.release(permit)
    await eventually(lambda: throttle._wake.errors > 0, 10)  # the wake read failed, and goes on
    await throttle.close()
    await throttle.client.aclose()
