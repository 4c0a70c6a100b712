"""The fleet tick on a 3-node Redis Cluster (deploy/local/redis-cluster.sh).

Each org's stats key is a hash tag of its own, so one Redis Functions call cannot write or read a
batch of them on a cluster: there ``LimitTracker`` keeps pipelining each org's commands. That
path must leave the stats and set the limits the batched calls do on a single Redis.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from support import require_service

from pipeline.admission import keys as k
from pipeline.admission.fleet import FleetLimits
from pipeline.admission.limits import ORGS_A_ROUND_TRIP, LimitPolicy, OrgLimits
from pipeline.admission.throttle import Throttle

pytestmark = pytest.mark.redis
CLUSTER_PORT = 7000
POLICY = LimitPolicy(defaults=OrgLimits(floor=2, burst_floor=2, burst_pct=0.5), f_min=0.25)
ORGS = [
    f"org-{i}" if i % 4 else f"{{acme:{i}}}:ünï-☃"  # a quarter with braces, colons, non-ASCII
    for i in range(ORGS_A_ROUND_TRIP + 123)  # two pipelines on the cluster
]


async def _delete_prefix(client: RedisCluster, prefix: str) -> None:
    """Delete the test's keys on every node (their names hold its unique prefix)."""
    async for key in client.scan_iter(match=f"*{prefix}*", count=1000):
        await client.delete(key)


@pytest.fixture
async def cluster(unique: str) -> AsyncIterator[tuple[RedisCluster, Throttle]]:
    """A cluster client and a started throttle on it, under a prefix of the test's own."""
    require_service("redis cluster (deploy/local/redis-cluster.sh)", "127.0.0.1", CLUSTER_PORT)
    url = f"redis://127.0.0.1:{CLUSTER_PORT}"
    client, wake = RedisCluster.from_url(url), RedisCluster.from_url(url)
    throttle = Throttle(client, prefix=f"c{unique}", namespace="n", wake_client=wake)  # type: ignore[arg-type]
    try:
        await throttle.start()
        yield client, throttle
    finally:
        await throttle.close()
        await _delete_prefix(client, f"c{unique}")
        await client.aclose()


@pytest.fixture
async def single(redis_service: str, unique: str) -> AsyncIterator[Throttle]:
    """A started throttle on the single Redis (its keys go with ``unique``)."""
    client = Redis.from_url(redis_service)
    throttle = Throttle(client, prefix=f"s{unique}", namespace="n")
    await throttle.start()
    yield throttle
    await throttle.close()
    await client.aclose()


def _fleet(throttle: Throttle) -> FleetLimits:
    fleet = FleetLimits(throttle.client, throttle.prefix, throttle, POLICY, member="m")
    fleet.bind(lambda: (30, 100))
    return fleet


async def test_a_tick_on_a_cluster_sets_what_the_batched_calls_set_on_one_redis(
    cluster: tuple[RedisCluster, Throttle], single: Throttle
) -> None:
    """1,123 orgs whose stats spread over the three nodes, three ticks over two minutes."""
    client, throttle = cluster
    on_cluster, on_single = _fleet(throttle), _fleet(single)
    assert on_cluster._tracker._functions is None  # the pipelined path
    assert on_single._tracker._functions is not None  # lim_record and lim_read
    slots = {client.keyslot(k.limit_stats(throttle.prefix, org)) for org in ORGS}
    assert len({client.nodes_manager.get_node_from_slot(slot).name for slot in slots}) == 3
    for tick, at in enumerate((1_000_000.0, 1_000_047.0, 1_000_094.0)):
        for i, org in enumerate(ORGS):
            for fleet in (on_cluster, on_single):
                for _ in range(i % 7 + tick + 1):
                    fleet.submitted(org)
                if i % 3:
                    fleet.finished(org, i / 3 + 0.1)
        expected = await on_single.tick(at)
        got = await on_cluster.tick(at)
        assert expected is not None
        assert got == expected, f"tick {tick}"
        for org in ORGS:
            stats = await client.hgetall(k.limit_stats(throttle.prefix, org))
            assert stats == await single.client.hgetall(k.limit_stats(single.prefix, org)), org
            assert await client.pttl(k.limit_stats(throttle.prefix, org)) > 0, org
    assert len(set(got.values())) > 3
