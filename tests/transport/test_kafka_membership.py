"""Kafka group membership on the real broker: both rebalance protocols and static members."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Literal

import pytest
from confluent_kafka import ConsumerGroupState
from contract.helpers import RecordingListener, consume_until, make_topic
from support import TcpRelay

from pipeline.config import Settings
from pipeline.envelope import Position
from pipeline.errors import ConfigError, UnknownTopic
from pipeline.transport.kafka import group as group_module
from pipeline.transport.kafka.consumer import KafkaConsumer
from pipeline.transport.kafka.group import (
    PROTOCOLS_CONFIG,
    admin_client,
    admin_config,
    broker_protocols,
    choose_protocol,
    consumer_config,
)
from pipeline.transport.kafka.transport import KafkaTransport

pytestmark = pytest.mark.usefixtures("kafka_service")
PARTITIONS = 6
MEMBER = Path(__file__).with_name("member_proc.py")


def kafka_settings(
    settings: Settings, protocol: Literal["auto", "consumer", "classic"], **client: str
) -> Settings:
    """The test settings with the given rebalance protocol and client properties."""
    kafka = settings.kafka.model_copy(update={"group_protocol": protocol, "client": client})
    return settings.model_copy(update={"kafka": kafka})


@pytest.fixture
async def topic(settings: Settings, unique: str) -> AsyncIterator[str]:
    """A fresh topic of six partitions holding one message per partition's worth of keys."""
    transport = KafkaTransport(settings)
    name = f"member_{unique}"
    await make_topic(transport, name, PARTITIONS)
    producer = transport.producer()
    for i in range(30):
        await producer.send(name, f"v{i}".encode(), key=f"k{i}".encode())
    await producer.close()
    yield name
    await transport.admin().delete_topic(name)


async def until_assigned(consumer: KafkaConsumer, count: int, timeout_s: float = 60) -> None:
    """Poll until the member owns ``count`` partitions."""
    deadline = time.monotonic() + timeout_s
    while len(consumer.assignment()) != count:
        assert time.monotonic() < deadline, f"owns {consumer.assignment()} after {timeout_s}s"
        await consumer.poll(100, 0.2)


def test_the_local_broker_offers_the_consumer_protocol(settings: Settings) -> None:
    """The local Kafka 4.1 offers KIP-848: ``auto`` picks it, but not for a static member."""
    assert "consumer" in broker_protocols(settings.kafka)
    assert choose_protocol(kafka_settings(settings, "auto").kafka) == "consumer"
    assert choose_protocol(kafka_settings(settings, "auto").kafka, static=True) == "classic"
    assert choose_protocol(kafka_settings(settings, "consumer").kafka, static=True) == "consumer"
    assert (
        choose_protocol(kafka_settings(settings, "consumer", **{"group.protocol": "classic"}).kafka)
        == "classic"
    )


def test_a_broker_out_of_reach_counts_as_classic_and_says_why(
    settings: Settings, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its configuration cannot be read: the classic protocol, and a warning with a reason."""
    monkeypatch.setattr(group_module, "_offered", {})  # nothing cached from another test
    kafka = settings.kafka.model_copy(
        update={"bootstrap_servers": "127.0.0.1:1", "request_timeout_ms": 300}
    )
    with caplog.at_level(logging.WARNING, logger="pipeline.transport.kafka.group"):
        assert broker_protocols(kafka) == frozenset({"classic"})
    (line,) = [r.getMessage() for r in caplog.records if PROTOCOLS_CONFIG in r.getMessage()]
    assert line.startswith(f"could not read {PROTOCOLS_CONFIG}; this client uses the classic ")
    assert not line.endswith(": "), line  # a timeout's empty text is not the reason given


def test_a_broker_out_of_reach_is_asked_again_once_it_answers(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fallback is not kept: a client opened after the broker came back gets its protocols.

    One address, first refusing connections, then relaying them to the local broker: the
    second call must find ``consumer`` (a member rejoining its group then uses it), not the
    ``classic`` the first call fell back to.
    """
    monkeypatch.setattr(group_module, "_offered", {})  # nothing cached from another test
    with socket.socket() as probe:  # a port nothing listens on, until the relay takes it
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    kafka = settings.kafka.model_copy(
        update={"bootstrap_servers": f"127.0.0.1:{port}", "request_timeout_ms": 300}
    )
    assert broker_protocols(kafka) == frozenset({"classic"})
    broker_host, _, broker_port = settings.kafka.bootstrap_servers.split(",")[0].rpartition(":")
    with TcpRelay(("127.0.0.1", port), (broker_host, int(broker_port))):
        assert "consumer" in broker_protocols(
            kafka.model_copy(update={"request_timeout_ms": 10_000})
        )


@pytest.mark.parametrize("protocol", ["consumer", "classic"])
async def test_member_consumes_under_each_protocol(
    settings: Settings, topic: str, unique: str, protocol: Literal["consumer", "classic"]
) -> None:
    """A member joins, owns every partition and reads every message under either protocol."""
    transport = KafkaTransport(kafka_settings(settings, protocol))
    consumer = transport.consumer(f"g-{unique}", [topic])
    try:
        received = await consume_until(consumer, lambda got: len(got) >= 30)
        assert sorted(int(m.value[1:]) for m in received) == list(range(30))
        assert consumer.protocol == protocol
        assert len(consumer.assignment()) == PARTITIONS
    finally:
        await consumer.close()


async def test_group_protocol_in_client_properties_does_not_crash(
    settings: Settings, topic: str, unique: str
) -> None:
    """group.protocol=consumer in PIPELINE_KAFKA__CLIENT runs: no session.timeout.ms is sent."""
    transport = KafkaTransport(
        kafka_settings(settings, "classic", **{"group.protocol": "consumer"})
    )
    consumer = transport.consumer(f"g-{unique}", [topic])
    try:
        received = await consume_until(consumer, lambda got: len(got) >= 30)
        assert len(received) == 30
        assert consumer.protocol == "consumer"
    finally:
        await consumer.close()


def test_a_member_fetches_a_partition_again_10_ms_after_its_read_ahead_was_full(
    settings: Settings,
) -> None:
    """Not librdkafka's second: behind a backlog a retry tier's copies would start that late.

    The setting and ``PIPELINE_KAFKA__CLIENT`` override it, in that order; the broker tests
    above build their members with it, so librdkafka accepts the property.
    """
    assert consumer_config(settings.kafka, "g", "m")["fetch.queue.backoff.ms"] == 10
    tuned = settings.kafka.model_copy(update={"fetch_queue_backoff_ms": 50})
    assert consumer_config(tuned, "g", "m")["fetch.queue.backoff.ms"] == 50
    client = tuned.model_copy(update={"client": {"fetch.queue.backoff.ms": "1000"}})
    assert consumer_config(client, "g", "m")["fetch.queue.backoff.ms"] == "1000"


def test_the_group_admin_client_gets_every_client_property(settings: Settings) -> None:
    """Not only ``security.``/``sasl.``/``ssl.``: a connection can need any of them.

    The protocol check, the group's session timeout and the stranded-partition watch use this
    client; with only the security properties, a broker reached with e.g.
    ``enable.ssl.certificate.verification=false`` could not be read by it.
    """
    client = {
        "enable.ssl.certificate.verification": "false",
        "client.dns.lookup": "use_all_dns_ips",
    }
    tuned = settings.kafka.model_copy(update={"client": client})
    assert admin_config(tuned).items() >= client.items()
    admin_client(tuned)  # librdkafka accepts them on an admin client
    bad = settings.kafka.model_copy(update={"client": {"no.such.property": "1"}})
    with pytest.raises(ConfigError, match=r"^PIPELINE_KAFKA__CLIENT: .*no\.such\.property"):
        admin_client(bad)


@pytest.mark.parametrize(
    ("client", "named"),
    [
        ({"no.such.property": "1"}, "no.such.property"),
        ({"fetch.wait.max.ms": "soon"}, "fetch.wait.max.ms"),
        ({"group.protocol": "consumer", "heartbeat.interval.ms": "500"}, "heartbeat.interval.ms"),
        ({"group.protocol": "newest"}, "group.protocol"),
    ],
)
async def test_bad_client_property_is_a_config_error_naming_it(
    settings: Settings, topic: str, unique: str, client: dict[str, str], named: str
) -> None:
    """An unknown, malformed or protocol-refused client property: one ConfigError naming it."""
    transport = KafkaTransport(kafka_settings(settings, "auto", **client))
    consumer = transport.consumer(f"g-{unique}", [topic])
    try:
        with pytest.raises(ConfigError) as caught:
            await consumer.poll(10, 0.2)
    finally:
        await consumer.close()
    message = str(caught.value)
    assert message.startswith("PIPELINE_KAFKA__CLIENT: ")
    assert named in message
    assert "\n" not in message


async def test_consumer_protocol_reports_an_undeclared_topic(
    settings: Settings, unique: str
) -> None:
    """Under KIP-848 a member of an undeclared topic fails with UnknownTopic instead of waiting."""
    transport = KafkaTransport(kafka_settings(settings, "consumer"))
    consumer = transport.consumer(f"g-{unique}", [f"missing_{unique}"])
    try:
        with pytest.raises(UnknownTopic, match="topics apply"):
            await consumer.poll(10, 0.2)
    finally:
        await consumer.close()


@pytest.mark.parametrize("protocol", ["consumer", "classic"])
async def test_restarted_static_member_takes_back_its_own_partitions(
    settings: Settings, topic: str, unique: str, protocol: Literal["consumer", "classic"]
) -> None:
    """A static member back under its name gets its partitions; the other member keeps its own."""
    group = f"g-{unique}"
    consumers: dict[str, KafkaConsumer] = {}
    listeners = {name: RecordingListener() for name in ("a", "b")}

    def member(name: str) -> KafkaConsumer:
        membership = settings.membership.model_copy(update={"instance": f"{unique}-{name}"})
        base = kafka_settings(settings, protocol)
        t = KafkaTransport(base.model_copy(update={"membership": membership}))
        consumer = t.consumer(group, [topic], listener=listeners[name])
        consumers[name] = consumer
        return consumer

    a, b = member("a"), member("b")
    try:
        await until_assigned(a, PARTITIONS)
        await asyncio.gather(until_assigned(b, PARTITIONS // 2), until_assigned(a, PARTITIONS // 2))
        a_owned, b_owned = a.assignment(), b.assignment()
        revoked_from_b = list(listeners["b"].revoked)
        await a.close()  # a static member keeps its slot: the broker does not rebalance
        listeners["a"] = RecordingListener()
        again = member("a")
        await until_assigned(again, PARTITIONS // 2)
        await b.poll(10, 0.5)
        assert again.assignment() == a_owned
        assert b.assignment() == b_owned
        assert listeners["b"].revoked == revoked_from_b
    finally:
        for consumer in consumers.values():
            await consumer.close()


async def test_static_consumer_protocol_member_killed_without_leaving_rejoins(
    settings: Settings, topic: str, unique: str
) -> None:
    """KIP-848: a kill -9'd static member's replacement, refused at first, rejoins by itself."""
    group = f"g-{unique}"
    env = {
        **os.environ,
        "PIPELINE_KAFKA__GROUP_PROTOCOL": "consumer",
        "PIPELINE_KAFKA__SESSION_TIMEOUT_MS": "6000",
    }
    args = [sys.executable, str(MEMBER), "kafka", group, topic, f"{unique}-a", str(PARTITIONS)]
    dead = await asyncio.create_subprocess_exec(*args, stdout=subprocess.PIPE, env=env)
    try:
        assert dead.stdout is not None
        line = await asyncio.wait_for(dead.stdout.readline(), 60)
        assert line.startswith(b"owned "), line
    finally:
        dead.kill()  # kill -9: no leave, the broker keeps the name until the session ends
        await dead.wait()
    kafka = settings.kafka.model_copy(
        update={"group_protocol": "consumer", "session_timeout_ms": 6000}
    )
    membership = settings.membership.model_copy(update={"instance": f"{unique}-a"})
    configured = settings.model_copy(update={"kafka": kafka, "membership": membership})
    replacement = KafkaTransport(configured).consumer(group, [topic])
    try:
        received = await consume_until(replacement, lambda got: len(got) >= 30, timeout_s=90)
        assert len(replacement.assignment()) == PARTITIONS
        assert sorted(int(m.value[1:]) for m in received) == list(range(30))
    finally:
        await replacement.close()


@pytest.mark.parametrize(("protocol", "static"), [("consumer", False), ("classic", True)])
async def test_a_rejoining_member_loses_its_partitions_and_gets_the_groups_answer(
    settings: Settings,
    topic: str,
    unique: str,
    protocol: Literal["consumer", "classic"],
    static: bool,
) -> None:
    """``rejoin``: every partition revoked as lost, then assigned again from the committed offsets.

    What a member does once it finds another member process running a partition it holds; the
    group coordinator, not the stale view, says which partitions are its own.
    """
    listener = RecordingListener()
    configured = kafka_settings(settings, protocol)
    if static:
        membership = settings.membership.model_copy(update={"instance": f"{unique}-a"})
        configured = configured.model_copy(update={"membership": membership})
    consumer = KafkaTransport(configured).consumer(f"g-{unique}", [topic], listener=listener)
    try:
        first = await consume_until(consumer, lambda got: len(got) >= 30, commit=False)
        tp = first[0].tp
        await consumer.commit([Position(tp, 1)])  # one partition done up to its first message
        await consumer.rejoin()
        assert sorted(listener.revoked) == sorted((p, True) for p in set(listener.assigned))
        assert consumer.assignment() == set()
        again = await consume_until(consumer, lambda got: len(got) >= 29, commit=False)
        assert len(consumer.assignment()) == PARTITIONS
        assert len(listener.assigned) == 2 * PARTITIONS
        assert listener.committed[tp] == Position(tp, 1)
        assert sorted((m.tp, m.offset) for m in again) == sorted(
            (m.tp, m.offset) for m in first if not (m.tp == tp and m.offset == 0)
        )
    finally:
        await consumer.close()


async def test_partitions_a_dead_member_left_mid_rebalance_are_given_out(
    settings: Settings, topic: str, unique: str
) -> None:
    """Classic cooperative-sticky: a member dies between a rebalance's two halves and is replaced.

    Member ``a`` owns every partition and stops serving its rebalances (stuck in its work);
    ``b`` joins, and the leader's first half takes half of ``a``'s partitions and gives them to
    nobody until ``a`` revokes them. ``a`` is killed -9 and comes back under its name: the
    coordinator hands the new process ``a``'s assignment without the moving half, with no
    rebalance, so that half would be assigned to no member for good. The members' watch finds it
    unowned at two checks and nudges the group: every partition is owned again.
    """
    group = f"g-{unique}"
    kafka = settings.kafka.model_copy(
        update={"group_protocol": "classic", "session_timeout_ms": 6000}
    )
    env = {
        **os.environ,
        "PIPELINE_KAFKA__GROUP_PROTOCOL": "classic",
        "PIPELINE_KAFKA__SESSION_TIMEOUT_MS": "6000",
    }
    args = [
        sys.executable,
        str(MEMBER),
        "kafka",
        group,
        topic,
        f"{unique}-a",
        str(PARTITIONS),
        "stop",
    ]
    stuck = await asyncio.create_subprocess_exec(*args, stdout=subprocess.PIPE, env=env)
    consumers: list[KafkaConsumer] = []

    def member(name: str) -> KafkaConsumer:
        membership = settings.membership.model_copy(update={"instance": f"{unique}-{name}"})
        configured = settings.model_copy(update={"kafka": kafka, "membership": membership})
        consumer = KafkaTransport(configured).consumer(group, [topic])
        consumers.append(consumer)
        return consumer

    admin = admin_client(kafka)

    def owners() -> tuple[object, dict[str, int]]:
        described = admin.describe_consumer_groups([group])[group].result(timeout=10)
        return described.state, {
            m.group_instance_id: len(m.assignment.topic_partitions) for m in described.members
        }

    try:
        assert stuck.stdout is not None
        line = await asyncio.wait_for(stuck.stdout.readline(), 60)
        assert line.startswith(b"owned "), line
        b = member("b")
        deadline = time.monotonic() + 60
        while await asyncio.to_thread(owners) != (
            ConsumerGroupState.STABLE,
            {f"{unique}-a": PARTITIONS // 2, f"{unique}-b": 0},
        ):  # the first half: the moving partitions belong to nobody until a revokes them
            assert time.monotonic() < deadline, await asyncio.to_thread(owners)
            await b.poll(10, 0.2)
        stuck.kill()  # kill -9 between the halves: a never revokes, never joins again
        await stuck.wait()
        again = member("a")
        deadline = time.monotonic() + 90
        while len(again.assignment()) + len(b.assignment()) < PARTITIONS:
            assert time.monotonic() < deadline, (again.assignment(), b.assignment())
            await asyncio.gather(again.poll(10, 0.2), b.poll(10, 0.2))
        assert again.assignment().isdisjoint(b.assignment())
        assert len(b.assignment()) > 0
    finally:
        if stuck.returncode is None:
            stuck.kill()
            await stuck.wait()
        for consumer in consumers:
            await consumer.close()
