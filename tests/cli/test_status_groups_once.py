"""``pipeline status`` asks about groups once per command; a group it cannot know is no missing one.

Redis: each lane whose group did not exist scanned the whole keyspace for the groups reading
it (6 lanes beside 200,000 keys: 1,200 SCAN calls, 1.0 s); it is scanned once. Kafka: each such
lane described every group again; they are described once. Under ACLs Kafka lists only the
groups the client may describe, so a group left out of the list is asked for by name.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from lane_support import drop, lane_spec, partly_consumed
from redis.asyncio import Redis

from pipeline.cli.status_groups import KafkaGroups, RedisGroups, missing_groups
from pipeline.config import Settings
from pipeline.observability.lanes import LaneWatch
from pipeline.transport.protocol import Transport
from pipeline.transport.redis_streams.keys import Keys


def _counting_scans(client: Redis) -> Callable[[], int]:
    """Count the SCANs ``client`` starts from cursor 0 (one per pass over the keyspace)."""
    passes = 0
    send = client.execute_command

    async def counted(*args: Any, **options: Any) -> Any:
        nonlocal passes
        if args[:1] == ("SCAN",) and str(args[1]) == "0":
            passes += 1
        return await send(*args, **options)

    client.execute_command = counted  # type: ignore[method-assign]
    return lambda: passes


async def test_redis_readers_of_six_lanes_scan_the_keyspace_once(redis: Redis, unique: str) -> None:
    """Six lanes without their group: one pass over the keyspace, each lane's readers right."""
    prefix = f"sg{unique}"
    keys = Keys(prefix)
    await redis.hset(keys.positions(f"r-{unique}"), mapping={f"lane0-{unique}:0": 5, "x:1": 2})
    await redis.hset(keys.positions(f"q-{unique}"), mapping={f"lane3-{unique}.retry-5s:2": 1})
    watches = [
        LaneWatch(
            lane=f"lane{i}",
            group=f"none{i}-{unique}",
            topics=(f"lane{i}-{unique}",),
            retry_topics={"5s": (f"lane{i}-{unique}.retry-5s",)},
        )
        for i in range(6)
    ]
    passes = _counting_scans(redis)
    missing = await missing_groups(RedisGroups(redis, prefix), watches)
    assert passes() == 1
    assert missing == {
        (watch.lane, watch.group): {0: (f"r-{unique}",), 3: (f"q-{unique}",)}.get(i, ())
        for i, watch in enumerate(watches)
    }


async def test_kafka_asks_for_a_group_it_did_not_list_and_describes_once(
    kafka: Transport, settings: Settings, unique: str
) -> None:
    """A group made after the list was read exists; three lanes' readers: one describe."""
    spec = lane_spec(f"grp-unlisted-{unique}")
    group, never = f"g-{unique}", f"never-{unique}"
    directory = KafkaGroups(settings.kafka, 10.0)
    assert await directory.existing({never}) == set()  # the list is read now, without group
    try:
        async with partly_consumed(kafka, spec, group, produced=2, committed=1):
            assert await directory.existing({group, never}) == {group}  # not listed: asked

            again = KafkaGroups(settings.kafka, 10.0)
            calls = _counting_describes(again)
            lanes = [[spec.name], [f"other-{unique}"], [f"third-{unique}"]]
            readers = [await again.readers(topics) for topics in lanes]
    finally:
        await drop(kafka, spec)
    if readers[0] is None:  # more groups than described on this shared broker: none asked
        assert calls() == 0
        return
    assert readers == [(group,), (), ()]
    assert calls() == 1


def _counting_describes(directory: KafkaGroups) -> Callable[[], int]:
    """Count the describe requests ``directory`` sends (each still sent to the cluster)."""
    admin = directory._admin  # the requests it sends are counted
    describe = admin.describe_consumer_groups
    calls = 0

    def counted(*args: Any, **options: Any) -> Any:
        nonlocal calls
        calls += 1
        return describe(*args, **options)

    admin.describe_consumer_groups = counted
    return lambda: calls


class _RefusingAdmin:
    """A cluster under ACLs: lists no group, refuses to describe ``refused``, lacks the rest."""

    def __init__(self, refused: str) -> None:
        self.refused = refused

    def list_consumer_groups(self, **_: Any) -> Future[Any]:
        done: Future[Any] = Future()
        done.set_result(type("Listed", (), {"valid": []})())
        return done

    def describe_consumer_groups(self, groups: list[str], **_: Any) -> dict[str, Future[Any]]:
        out: dict[str, Future[Any]] = {}
        for group in groups:
            out[group] = Future()
            code = (
                KafkaError.GROUP_AUTHORIZATION_FAILED
                if group == self.refused
                else KafkaError.GROUP_ID_NOT_FOUND
            )
            out[group].set_exception(KafkaException(KafkaError(code)))
        return out


async def test_a_group_kafka_refuses_to_describe_is_not_called_missing(
    settings: Settings,
) -> None:
    """Not listed and its describe refused (ACLs): not missing; GROUP_ID_NOT_FOUND: missing."""
    directory = KafkaGroups(settings.kafka, 1.0)
    directory._admin = _RefusingAdmin("secret-group")  # type: ignore[assignment]
    watches = [LaneWatch("a", "secret-group", ("a",)), LaneWatch("b", "gone-group", ("b",))]
    missing = await missing_groups(directory, watches)
    assert missing == {("b", "gone-group"): ()}
