"""The fleet tick on a Redis Cluster of one shard reached through a plain client.

``pipeline consume`` always talks to Redis through a plain client (``run.redis_client``). Every
call of the throttle, the guard and the debouncer stays in one slot, so a cluster-enabled Redis
holding every slot on one node (a managed "cluster mode" of one shard, or a proxy in front of a
cluster) serves them all. So did the dynamic limits' per-org pipelines; one ``lim_record`` call
over the stats keys of many orgs, each a hash tag of its own, is refused there (``CROSSSLOT``),
and every tick failed, as "Redis unavailable", with no limit ever recomputed. The tracker now
goes back to the pipelines for that Redis once it refuses such a call.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from ingress.redis_server import free_port
from redis.asyncio import Redis

from pipeline.admission import keys as k
from pipeline.admission.fleet import FleetLimits
from pipeline.admission.limits import ORGS_A_CALL, LimitPolicy, OrgLimits
from pipeline.admission.throttle import Throttle
from pipeline.redis_channel import open_channel

pytestmark = pytest.mark.redis
POLICY = LimitPolicy(defaults=OrgLimits(floor=2, burst_floor=2, burst_pct=0.5), f_min=0.25)
ORGS = [f"org-{i}" for i in range(ORGS_A_CALL + 50)]  # two calls' worth


def _answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(64).startswith(b"+PONG")
    except OSError:
        return False


def _cluster_node(tmp_path: Path) -> tuple[subprocess.Popen[bytes], int]:
    """A cluster-enabled redis-server answering on a free port; the process and its port.

    Its cluster bus gets a free port of its own (``--cluster-port``): by default it is the port
    plus 10,000, which another process may hold, and the server then exits at start. A start
    that loses a port to another process all the same is made again on new ports.
    """
    for _ in range(5):
        port = free_port()
        bus = free_port()
        if bus == port:
            continue
        process = subprocess.Popen(
            [
                "redis-server",
                *("--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"),
                *("--cluster-enabled", "yes", "--cluster-port", str(bus)),
                *("--cluster-config-file", str(tmp_path / f"nodes-{port}.conf")),
                *("--dir", str(tmp_path)),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while not _answers(port) and process.poll() is None:
            assert time.monotonic() < deadline, "redis-server does not answer"
            time.sleep(0.05)
        if process.poll() is None:
            return process, port
        process.wait(timeout=10)
    raise AssertionError("redis-server exited at start five times (ports taken?)")


@pytest.fixture
def one_shard(tmp_path: Path) -> Iterator[str]:
    """A private cluster-enabled redis-server holding every slot; its URL. Killed at the end."""
    process, port = _cluster_node(tmp_path)
    try:
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        process.kill()
        process.wait(timeout=10)


@pytest.fixture
async def client(one_shard: str) -> AsyncIterator[Redis]:
    """A plain client of the one-shard cluster, once the cluster serves every slot."""
    redis = Redis.from_url(one_shard)
    await redis.execute_command("CLUSTER", "ADDSLOTSRANGE", 0, 16383)
    state = [b""]

    async def poll() -> None:
        while b"cluster_state:ok" not in state[0]:
            state[0] = await redis.execute_command("CLUSTER", "INFO")
            await asyncio.sleep(0.02)

    await asyncio.wait_for(poll(), 30)
    yield redis
    await redis.aclose()


@pytest.mark.parametrize("channel", [False, True], ids=["redis-py", "function-channel"])
async def test_a_tick_on_a_one_shard_cluster_sets_the_limits(
    client: Redis, channel: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """Stats written and read, every org's limit set, one warning line for the member."""
    if channel:
        assert open_channel(client) is not None  # as ``pipeline consume`` binds one
    throttle = Throttle(client, prefix="pl", namespace="n")
    await throttle.start()
    try:
        fleet = FleetLimits(client, "pl", throttle, POLICY, member="m")
        fleet.bind(lambda: (1, 100))
        for tick, at in enumerate((1_000_000.0, 1_000_010.0)):
            for org in ORGS:
                fleet.submitted(org)
                fleet.finished(org, 1.5)
            with caplog.at_level(logging.WARNING, logger="pipeline.admission.limits"):
                limits = await fleet.tick(at)
            assert limits is not None, f"tick {tick}"
            assert sorted(limits) == sorted(ORGS)
            assert set(limits.values()) == {8}  # base 2, ceiling 4, an idle fleet's factor 2
        stats = await client.hgetall(k.limit_stats("pl", ORGS[-1]))
        assert stats == {b"n:16666": b"2", b"c:16666": b"2", b"d:16666": b"3"}
        assert await client.pttl(k.limit_stats("pl", ORGS[-1])) > 0
        refused = [r for r in caplog.records if "CROSSSLOT" in r.getMessage()]
        assert len(refused) == 1  # once, not at every tick
    finally:
        await throttle.close()
        if channel:
            bound = open_channel(client)
            assert bound is not None
            await bound.aclose()
