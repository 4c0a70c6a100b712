"""The fault scenarios: each drives webhook load through a real pipeline while a fault hits it."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from functools import partial

import pytest
from faults.cluster import Cluster
from faults.runner import Fault, Scenario, make_events, run, thresholds
from faults.services import KafkaServer, PrivateRedis

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]  # a broker start or restart is slow

N, KEYS = 160, 16
PAUSE_S = 6.0  # longer than the members' 3 s session timeout
TRANSPORTS = pytest.mark.parametrize("transport", ["redis", "kafka"])


@TRANSPORTS
async def test_kill_ingress_and_sweeper(
    make_cluster: Callable[[str], Cluster], transport: str
) -> None:
    """A kill -9 of the ingress, then of the sweeper, loses no accepted webhook."""
    cluster = make_cluster(transport)
    first, second = thresholds(seed=9, count=2, total=N)
    faults = [
        Fault("kill -9 ingress", first, cluster.kill_ingress),
        Fault("kill -9 sweeper", second, cluster.kill_sweeper),
    ]
    scenario = Scenario(
        "kill ingress and sweeper", make_events(N, KEYS), faults, strict_order=False
    )
    await run(cluster, scenario)


@TRANSPORTS
async def test_kill_consumers(make_cluster: Callable[[str], Cluster], transport: str) -> None:
    """Members killed (-9) at random moments: exactly once or dead-lettered, in key order."""
    cluster = make_cluster(transport)
    rng = random.Random(11)
    faults = [
        Fault(f"kill -9 member {slot}", at, partial(cluster.kill_member, slot))
        for at, slot in zip(
            thresholds(seed=11, count=3, total=N), [0, 1, rng.randrange(2)], strict=True
        )
    ]
    # A member killed after an effect finished but before the guard recorded it lets the
    # redelivery run it again (the guard's documented limit): counted, not failed, while the
    # receiving end's event-id key keeps the applied effect single (checked above all else).
    scenario = Scenario("kill consumers", make_events(N, KEYS), faults, repeats_allowed=True)
    await run(cluster, scenario)


async def test_redis_restart(
    make_cluster: Callable[[str], Cluster], private_redis: PrivateRedis
) -> None:
    """A kill -9 and restart of the Redis that carries the streams and the runtime state."""
    cluster = make_cluster("redis")
    (at,) = thresholds(seed=13, count=1, total=N)
    faults = [Fault("redis restart", at, partial(asyncio.to_thread, private_redis.restart))]
    # The side effect's own store crashes too: a call cut off after Redis ran it but before the
    # answer is an ambiguous outcome, which the guard may let run again (counted, not failed).
    scenario = Scenario(
        "redis restart", make_events(N, KEYS), faults, strict_order=False, repeats_allowed=True
    )
    await run(cluster, scenario)


async def test_broker_restart(
    make_cluster: Callable[[str], Cluster], private_kafka: KafkaServer
) -> None:
    """A restart of the Kafka broker while webhooks keep arriving."""
    cluster = make_cluster("kafka")
    (at,) = thresholds(seed=17, count=1, total=N)
    faults = [Fault("broker restart", at, partial(asyncio.to_thread, private_kafka.restart))]
    scenario = Scenario("broker restart", make_events(N, KEYS), faults, strict_order=False)
    await run(cluster, scenario)


async def test_broker_paused_past_session_timeout(
    make_cluster: Callable[[str], Cluster], private_kafka: KafkaServer
) -> None:
    """SIGSTOP of the Kafka broker for longer than the members' session timeout, then SIGCONT."""
    cluster = make_cluster("kafka")

    async def pause() -> None:
        private_kafka.pause()
        try:
            await asyncio.sleep(PAUSE_S)  # the fault's duration
        finally:
            private_kafka.resume()

    (at,) = thresholds(seed=19, count=1, total=N)
    faults = [Fault("broker SIGSTOP", at, pause)]
    scenario = Scenario("broker paused", make_events(N, KEYS), faults, strict_order=False)
    result = await run(cluster, scenario)
    # A member whose session timed out is often fenced by its own rejoin (librdkafka#3437):
    # it rejoins with a new client instead of exiting.
    assert result["crashes"] == {}, result["crashes"]


@TRANSPORTS
async def test_poison_message(make_cluster: Callable[[str], Cluster], transport: str) -> None:
    """A message that kills every member that runs it ends in the DLQ as poison; the rest flows."""
    cluster = make_cluster(transport)
    poison = N // 3
    # Each crash may cut a neighbour off between its effect and the guard's record (see above).
    scenario = Scenario(
        "poison message", make_events(N, KEYS, {poison: "poison"}), repeats_allowed=True
    )
    result = await run(cluster, scenario)
    assert result["member_restarts"] >= 3  # retry.poison_after crashes
    # Suspects run alone, so the events that ran beside the poison when it struck are not
    # blamed: the poison is the only dead letter.
    assert result["dead_by_id"] == {f"evt-{poison}": "poison"}


@TRANSPORTS
async def test_slow_handler_burst(make_cluster: Callable[[str], Cluster], transport: str) -> None:
    """A burst of slow handlers delays but loses, repeats and reorders nothing."""
    cluster = make_cluster(transport)
    rng = random.Random(23)
    slow = {n: "slow" for n in range(N // 3, 2 * N // 3) if rng.random() < 0.3}
    result = await run(cluster, Scenario("slow handler burst", make_events(N, KEYS, slow)))
    assert result["dead"] == {}
    assert result["applied"] == N
