"""The throttle on a Redis Cluster: the shared one (deploy/local/redis-cluster.sh), or its own.

The tests that migrate a slot do it on a private cluster (``slot_migration``): on the shared one
a concurrent test's new key in that slot was redirected to the importing node and stranded there.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from itertools import count

import pytest
from admission.slot_migration import migrating, owner_and_other, private_cluster
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


@pytest.fixture(scope="module")
def private_url() -> Iterator[str]:
    """A Redis Cluster of this module's own, for the tests that migrate a slot.

    A slot migrating on the shared cluster redirected a concurrent test's new key in that slot
    to the importing node, where it stayed once the slot was stable again (``slot_migration``).
    """
    with private_cluster() as url:
        yield url


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


async def test_a_call_during_a_slot_migration_changes_nothing(private_url, unique):
    """A throttle call refused while its slot migrates leaves no half-done change behind.

    The functions declared only ``T:meta``, so Redis ran them on the migrating node and stopped
    one at the first key missing there: a lapsed holder was already removed from the key when
    its hand-over failed, and the waiter it was owed never got the free slot, after the
    migration as well.
    """
    client = RedisCluster.from_url(private_url)
    namespace = f"mig{unique}"
    dead = ThrottleFunctions(client, "pltest", namespace, member="dead", default_limit=1)
    alive = ThrottleFunctions(client, "pltest", namespace, member="alive", default_limit=1)
    slot = await client.cluster_keyslot(k.meta("pltest", namespace))
    try:
        assert (await dead.acquire("held", 0, 60_000, ["org:a"], try_only=False)).state == "granted"
        assert (
            await alive.acquire("owed", 0, 60_000, ["org:a"], try_only=False)
        ).state == "waiting"
        await client.zadd(k.leases("pltest", namespace), {"held": 1})  # its member died long ago
        async with migrating(client, slot):
            with pytest.raises(rexc.RedisError):  # refused while the slot migrates
                await alive.renew(["owed"])
        assert (await alive.renew(["owed"])).letters == "g"  # the lapsed slot went to the waiter
    finally:
        await _delete_namespace(client, "pltest", namespace)
        await client.aclose()


async def test_an_acquisition_during_a_slot_migration_fails_open(private_url, unique, caplog):
    """An acquisition refused while its slot migrates is admitted unconditionally, in one line."""
    client = RedisCluster.from_url(private_url)
    namespace = f"mfo{unique}"
    throttle = Throttle(
        client,
        prefix="pltest",
        namespace=namespace,
        default_limit=1,
        wake_client=RedisCluster.from_url(private_url),
    )
    await throttle.start()
    slot = await client.cluster_keyslot(k.meta("pltest", namespace))
    try:
        await throttle.release(await throttle.acquire(["org:a"]))  # the namespace's keys exist
        caplog.clear()
        async with migrating(client, slot):
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


async def _keys_in_slot(client: RedisCluster, slot: int) -> dict[str, int]:
    """How many keys of ``slot`` each primary holds, and ``"unstable"``: the slot marks seen.

    A node shows a slot it migrates or imports as ``[slot->-id]`` or ``[slot-<-id]`` in the line
    of ``CLUSTER NODES`` describing itself.
    """
    found = {"unstable": 0}
    for node in client.get_primaries():
        plain = Redis(host=node.host, port=node.port)
        try:
            found[node.name] = await plain.execute_command("CLUSTER", "COUNTKEYSINSLOT", slot)
            lines = (await plain.execute_command("CLUSTER", "NODES")).decode().splitlines()
            found["unstable"] += sum("myself" in line and "[" in line for line in lines)
        finally:
            await plain.aclose()
    return found


async def test_a_slot_migration_leaves_every_key_on_the_node_serving_its_slot(private_url):
    """A key another client creates in a migrating slot is on the slot's owner after, readable.

    The migrating node redirects (``ASK``) a command for a key it does not hold to the importing
    node, which creates the key there; set ``STABLE`` again, the importing node kept it out of
    every client's reach (and its test's cleanup), and the owner answered as if it had never
    been written. So too when the test fails while the slot migrates.
    """
    client = RedisCluster.from_url(private_url)
    other = RedisCluster.from_url(private_url)  # another test's client, unaware of the migration
    slot = 5
    key = next(name for i in count() if client.keyslot(name := f"{{other-{i}}}:stats") == slot)
    mine = next(name for i in count() if client.keyslot(name := f"{{mine-{i}}}:x") == slot)
    owner, importer = (node.name for node in await owner_and_other(client, slot))
    try:
        await client.set(mine, "1")
        async with migrating(client, slot, moved=[mine]):
            await other.hset(key, "n", "1")
            assert (await _keys_in_slot(client, slot))[importer] == 2
        assert (await other.hgetall(key), await client.get(mine)) == ({b"n": b"1"}, b"1")
        assert await _keys_in_slot(client, slot) == {"unstable": 0, owner: 2, importer: 0}
        with pytest.raises(RuntimeError, match="the test failed"):
            async with migrating(client, slot, moved=[mine, key]):
                raise RuntimeError("the test failed")
        assert await _keys_in_slot(client, slot) == {"unstable": 0, owner: 2, importer: 0}
    finally:
        await client.delete(key, mine)
        await client.aclose()
        await other.aclose()
