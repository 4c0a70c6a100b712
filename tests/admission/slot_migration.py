"""A Redis Cluster slot put into the migrating state, on a private cluster of the test's own.

While a slot migrates, its owner answers a command for a key it does not hold with an ``ASK``
redirect to the importing node, which then creates the key. On the shared cluster
(127.0.0.1:7000-7002) that was any concurrent test's key whose hash tag fell in the slot (the
suite runs its files in parallel, and the fleet tests alone write a hash tag per org, thousands
of slots): once the slot was set ``STABLE`` again the key sat on a node that does not serve the
slot, out of every client's reach and of its test's cleanup. No slot is safe from hash tags of
random names, so a test that migrates a slot does it on :func:`private_cluster`, and
:func:`migrating` leaves even that cluster as it found it.
"""

from __future__ import annotations

import contextlib
import tempfile
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from subprocess import Popen

from ingress.redis_server import require_redis_server, start_redis
from redis import Redis as SyncRedis
from redis.asyncio import Redis
from redis.asyncio.cluster import ClusterNode, RedisCluster

from pipeline.testing.ports import free_port

READY_S = 30.0
"""How long a private cluster may take to agree that it serves every slot."""
SLOTS = 16384


def _node(directory: Path) -> tuple[Popen[bytes], int, int]:
    """A cluster-enabled ``redis-server`` without persistence; the process, its port and bus port.

    The bus gets a free port of its own (by default it is the port plus 10,000, which another
    process may hold); a start that loses a port to another process is made again on new ones.
    """
    for attempt in range(5):
        port, bus = free_port(), free_port()
        try:
            process = start_redis(
                port,
                *("--cluster-enabled", "yes", "--cluster-port", str(bus)),
                *("--cluster-config-file", str(directory / f"nodes-{port}.conf")),
                *("--dir", str(directory), "--save", "", "--appendonly", "no"),
            )
        except AssertionError:
            if attempt == 4:
                raise
            continue
        return process, port, bus
    raise AssertionError("unreachable")


def _ready(client: SyncRedis, nodes: int) -> bool:
    info = client.cluster("INFO")
    return (
        info.get("cluster_state") == "ok"
        and int(info.get("cluster_known_nodes", 0)) == nodes
        and int(info.get("cluster_slots_assigned", 0)) == SLOTS
    )


@contextlib.contextmanager
def private_cluster(nodes: int = 2) -> Iterator[str]:
    """The URL of a Redis Cluster of ``nodes`` primaries no other test knows; stopped after.

    Each primary serves an equal range of slots. Ready once every node says the cluster is ok,
    knows every other node and sees every slot assigned. Its files go with it. Skips the test
    when ``redis-server`` is not installed (fails under CI=true).
    """
    require_redis_server()
    with tempfile.TemporaryDirectory(prefix="pl-cluster-") as directory:
        started: list[tuple[Popen[bytes], int, int]] = []
        clients: list[SyncRedis] = []
        try:
            for i in range(nodes):
                started.append(_node(Path(directory)))
                clients.append(SyncRedis(port=started[-1][1], decode_responses=True))
                clients[-1].execute_command("CLUSTER", "SET-CONFIG-EPOCH", i + 1)
            for _, port, bus in started[1:]:
                clients[0].execute_command("CLUSTER", "MEET", "127.0.0.1", port, bus)
            for i, client in enumerate(clients):
                first, last = i * SLOTS // nodes, (i + 1) * SLOTS // nodes - 1
                client.execute_command("CLUSTER", "ADDSLOTSRANGE", first, last)
            deadline = time.monotonic() + READY_S
            while not all(_ready(client, nodes) for client in clients):
                assert time.monotonic() < deadline, f"private cluster not ok after {READY_S}s"
                time.sleep(0.02)
            yield f"redis://127.0.0.1:{started[0][1]}"
        finally:
            for client in clients:
                client.close()
            for process, _, _ in started:
                process.kill()
                process.wait(timeout=10)


async def owner_and_other(client: RedisCluster, slot: int) -> tuple[ClusterNode, ClusterNode]:
    """The primary serving ``slot`` and another primary (as ``client`` knows the cluster)."""
    await client.initialize()  # a client that has sent nothing yet knows no node
    owner = client.nodes_manager.get_node_from_slot(slot)
    other = next(n for n in client.get_primaries() if n.name != owner.name)
    return owner, other


async def _move_back(target: Redis, source: ClusterNode, slot: int) -> None:
    """``MIGRATE`` every key ``target`` holds in ``slot`` to ``source`` (which serves the slot)."""
    while names := await target.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 100):
        async with target.pipeline(transaction=False) as pipe:  # ASKING: the slot's importer
            pipe.execute_command("ASKING")
            pipe.execute_command("MIGRATE", source.host, source.port, "", 0, 5000, "KEYS", *names)
            await pipe.execute()


@contextlib.asynccontextmanager
async def migrating(
    client: RedisCluster, slot: int, moved: Sequence[str] = ()
) -> AsyncIterator[tuple[Redis, Redis]]:
    """``slot`` migrating from its owner to another primary, with the keys ``moved`` moved there.

    Yields plain clients on the owner (the migrating node) and on the importing node. After,
    whatever happened: the owner stops redirecting (``STABLE``), every key of the slot the
    importing node holds (those moved, those created there through ``ASK`` meanwhile) goes back
    to the owner, and the importing node is ``STABLE`` too, so no key is left on a node that
    does not serve its slot.
    """
    owner, other = await owner_and_other(client, slot)
    source = Redis(host=owner.host, port=owner.port)
    target = Redis(host=other.host, port=other.port)
    try:
        source_id = (await source.execute_command("CLUSTER", "MYID")).decode()
        target_id = (await target.execute_command("CLUSTER", "MYID")).decode()
        try:
            await target.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", source_id)
            await source.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", target_id)
            if moved:
                await source.execute_command(
                    "MIGRATE", other.host, other.port, "", 0, 5000, "KEYS", *moved
                )
            yield source, target
        finally:
            try:
                await source.execute_command("CLUSTER", "SETSLOT", slot, "STABLE")
                await _move_back(target, owner, slot)
            finally:
                for node in (target, source):
                    await node.execute_command("CLUSTER", "SETSLOT", slot, "STABLE")
    finally:
        for c in (source, target):
            await c.aclose()
