"""The throttle's key layout on a 3-node Redis Cluster (deploy/local/redis-cluster.sh)."""

from __future__ import annotations

import asyncio

import pytest
from redis.asyncio.cluster import RedisCluster
from runtime.helpers import eventually
from support import require_service

from pipeline.admission import keys as k
from pipeline.admission.throttle import Throttle

pytestmark = pytest.mark.redis
CLUSTER_PORT = 7000


async def test_multi_key_acquire_and_handover_on_cluster(unique):
    """Multi-key acquisition, hand-over and wake work across the cluster's nodes."""
    require_service("redis cluster (deploy/local/redis-cluster.sh)", "127.0.0.1", CLUSTER_PORT)
    url = f"redis://127.0.0.1:{CLUSTER_PORT}"
    clients = [RedisCluster.from_url(url) for _ in range(4)]
    throttles = []
    for i, ns in enumerate([f"a{unique}", f"b{unique}"]):
        t = Throttle(clients[2 * i], namespace=ns, default_limit=1, wake_client=clients[2 * i + 1])
        await t.start()
        throttles.append(t)
    slots = {await clients[0].cluster_keyslot(k.meta("pl", f"{c}{unique}")) for c in "ab"}
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
    for t in throttles:
        await t.close()
    for c in clients[::2]:
        await c.aclose()
