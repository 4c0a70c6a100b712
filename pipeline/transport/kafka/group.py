"""Which rebalance protocol a Kafka group member speaks, and the properties it is built with.

Two protocols exist. ``classic`` is the client-driven JoinGroup/SyncGroup protocol, here with the
cooperative-sticky assignor; its member sets ``session.timeout.ms`` and ``heartbeat.interval.ms``.
``consumer`` (KIP-848, Kafka 4 brokers) moves assignment to the broker: a member joining or
leaving no longer stops the others, and the session timeout and heartbeat interval are the
broker's (``group.consumer.session.timeout.ms``), so librdkafka refuses those properties. A
property that does not apply to the chosen protocol is therefore never sent.

``auto`` picks ``consumer`` when the broker lists it in ``group.coordinator.rebalance.protocols``
(read once per process and bootstrap address), else ``classic``; a static member stays on
``classic`` while the broker offers it (see :func:`choose_protocol` for why).

Static membership: the member's stable name (:mod:`pipeline.transport.identity`) becomes
``group.instance.id``, so a restarted member takes its partitions back without a rebalance.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Literal

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ResourceType,
)

from pipeline.config import KafkaSettings
from pipeline.errors import ConfigError
from pipeline.transport.kafka.errors import CLIENT_VARIABLE, client_config_error, translate

log = logging.getLogger(__name__)

Protocol = Literal["consumer", "classic"]
PROTOCOLS_CONFIG = "group.coordinator.rebalance.protocols"
CLASSIC_ONLY = ("session.timeout.ms", "heartbeat.interval.ms", "partition.assignment.strategy")

CONSUMER_ONLY = frozenset(
    {
        "group.id",
        "group.instance.id",
        "partition.assignment.strategy",
        "session.timeout.ms",
        "heartbeat.interval.ms",
        "group.protocol.type",
        "group.protocol",
        "group.remote.assignor",
        "coordinator.query.interval.ms",
        "max.poll.interval.ms",
        "enable.auto.commit",
        "auto.commit.interval.ms",
        "enable.auto.offset.store",
        "queued.min.messages",
        "queued.max.messages.kbytes",
        "fetch.wait.max.ms",
        "fetch.queue.backoff.ms",
        "fetch.message.max.bytes",
        "max.partition.fetch.bytes",
        "fetch.max.bytes",
        "fetch.min.bytes",
        "fetch.error.backoff.ms",
        "isolation.level",
        "enable.partition.eof",
        "check.crcs",
        "auto.offset.reset",
    }
)
"""librdkafka's consumer properties (``C`` in its CONFIGURATION.md).

A producer or an admin client given one ignores it with a ``CONFWARN`` warning.
"""
PRODUCER_ONLY = frozenset(
    {
        "transactional.id",
        "transaction.timeout.ms",
        "enable.idempotence",
        "enable.gapless.guarantee",
        "queue.buffering.max.messages",
        "queue.buffering.max.kbytes",
        "queue.buffering.max.ms",
        "linger.ms",
        "message.send.max.retries",
        "retries",
        "queue.buffering.backpressure.threshold",
        "compression.codec",
        "compression.type",
        "compression.level",
        "batch.num.messages",
        "batch.size",
        "delivery.report.only.error",
        "sticky.partitioning.linger.ms",
        "request.required.acks",
        "acks",
        "request.timeout.ms",
        "message.timeout.ms",
        "delivery.timeout.ms",
        "partitioner",
    }
)
"""librdkafka's producer properties (``P`` in its CONFIGURATION.md).

A consumer given one ignores it with a ``CONFWARN`` warning; an admin client (a producer
instance inside librdkafka) has no use for them.
"""
ClientKind = Literal["producer", "consumer", "admin"]
_NOT_FOR: dict[ClientKind, frozenset[str]] = {
    "producer": CONSUMER_ONLY,
    "consumer": PRODUCER_ONLY,
    "admin": CONSUMER_ONLY | PRODUCER_ONLY,
}

_offered: dict[str, frozenset[str]] = {}
_offered_lock = threading.Lock()
_timeouts_applied: dict[str, bool] = {}


def broker_protocols(settings: KafkaSettings) -> frozenset[str]:
    """The rebalance protocols the cluster's group coordinators offer (blocking; cached).

    A broker older than KIP-848, or one that refuses to describe its configuration, counts as
    offering ``classic`` only. A cluster out of reach counts as ``classic`` for this call only:
    the answer is not kept, so a client opened later (a member rejoining its group) asks again
    instead of staying on the classic protocol for the life of the process.
    """
    with _offered_lock:
        cached = _offered.get(settings.bootstrap_servers)
        if cached is not None:
            return cached
        offered = _describe(settings)
        if offered is None:
            return frozenset({"classic"})
        _offered[settings.bootstrap_servers] = offered
        return offered


def client_properties(settings: KafkaSettings, kind: ClientKind) -> dict[str, str]:
    """The properties of ``PIPELINE_KAFKA__CLIENT`` that apply to a client of this kind.

    A consumer gets all but :data:`PRODUCER_ONLY`, a producer all but :data:`CONSUMER_ONLY`, an
    admin client neither, so no client logs a ``CONFWARN`` warning for a property meant for
    another. Any other name goes to every client: librdkafka checks it when the client is built,
    so a misspelt one still fails every command.
    """
    dropped = _NOT_FOR[kind]
    return {k: v for k, v in settings.client.items() if k not in dropped}


def admin_config(settings: KafkaSettings) -> dict[str, Any]:
    """An admin client's properties: the cluster, and those of ``PIPELINE_KAFKA__CLIENT`` for it.

    All but the consumer's and the producer's own (:func:`client_properties`): a connection
    needs more than its ``security.``/``sasl.``/``ssl.`` properties
    (``enable.ssl.certificate.verification``, ``client.dns.lookup``,
    ``broker.address.family``...).
    """
    return {
        "bootstrap.servers": settings.bootstrap_servers,
        "client.id": f"{settings.client_id}-admin",
        "socket.timeout.ms": settings.request_timeout_ms,
        # Metadata of one named topic must never create it on a broker that would.
        "allow.auto.create.topics": False,
        # librdkafka's own lines go through our logging (rate-limited), not raw to stderr
        "logger": logging.getLogger("pipeline.librdkafka"),
        **client_properties(settings, "admin"),
    }


def admin_client(settings: KafkaSettings) -> AdminClient:
    """An admin client of the cluster (:func:`admin_config`).

    Raises:
        ConfigError: a property of ``PIPELINE_KAFKA__CLIENT`` is refused (the line names it).
        TransportError: librdkafka could not create the client for another reason.
    """
    try:
        return AdminClient(admin_config(settings))
    except KafkaException as exc:
        problem = client_config_error(exc, settings.client)
        raise problem or translate(exc, "create admin client") from None


def _describe(settings: KafkaSettings) -> frozenset[str] | None:
    """What the cluster's configuration says, or None if the cluster could not be read."""
    timeout_s = settings.request_timeout_ms / 1000
    admin = admin_client(settings)
    try:
        # The cluster's nodes alone: its topic metadata would grow with the number of topics.
        cluster = admin.describe_cluster(request_timeout=timeout_s).result(timeout=timeout_s)
        brokers = [node.id for node in cluster.nodes]
        if not brokers:
            return frozenset({"classic"})
        resource = ConfigResource(ResourceType.BROKER, str(min(brokers)))
        configs = admin.describe_configs([resource], request_timeout=timeout_s)
        entries = configs[resource].result(timeout=timeout_s)
    except (KafkaException, TimeoutError) as exc:  # a broker out of reach: said when consuming
        reason = str(exc) or f"no answer from {settings.bootstrap_servers} within {timeout_s:g} s"
        log.warning(
            "could not read %s; this client uses the classic protocol: %s",
            PROTOCOLS_CONFIG,
            reason,
        )
        return None
    entry = entries.get(PROTOCOLS_CONFIG)
    if entry is None or not entry.value:
        return frozenset({"classic"})
    return frozenset(p.strip() for p in entry.value.split(",") if p.strip())


def apply_group_timeouts(settings: KafkaSettings, group: str) -> bool:
    """Give a KIP-848 group the configured session timeout (blocking; once per process and group).

    Under the consumer protocol the session timeout and heartbeat interval are group configs on
    the broker (``consumer.session.timeout.ms``, ``consumer.heartbeat.interval.ms``), bounded by
    the broker's ``group.consumer.min.*`` settings; without them a dead member holds its
    partitions for the broker default (45 s). The heartbeat interval is a fifth of the session
    where the broker allows it. Returns whether the broker took the session timeout; a refusal
    is logged once, and the member runs with the broker's values.
    """
    key = f"{settings.bootstrap_servers}/{group}"
    with _offered_lock:
        if key in _timeouts_applied:
            return _timeouts_applied[key]
        session_ms = settings.session_timeout_ms
        attempts = [
            {
                "consumer.session.timeout.ms": session_ms,
                "consumer.heartbeat.interval.ms": max(session_ms // 5, 100),
            },
            {"consumer.session.timeout.ms": session_ms},
        ]
        admin = admin_client(settings)
        timeout_s = settings.request_timeout_ms / 1000
        problem = ""
        for attempt in attempts:
            resource = ConfigResource(
                ResourceType.GROUP,
                group,
                incremental_configs=[
                    ConfigEntry(k, str(v), incremental_operation=AlterConfigOpType.SET)
                    for k, v in attempt.items()
                ],
            )
            try:
                admin.incremental_alter_configs([resource])[resource].result(timeout=timeout_s)
            except KafkaException as exc:
                problem = str(exc.args[0].str() if exc.args else exc)
                continue
            _timeouts_applied[key] = True
            return True
        log.warning(
            "group %s keeps the broker's session timeout (consumer protocol): %s", group, problem
        )
        _timeouts_applied[key] = False
        return False


def choose_protocol(settings: KafkaSettings, *, static: bool = False) -> Protocol:
    """The protocol a member uses: ``group.protocol`` in the client properties, else the setting.

    ``auto`` picks ``consumer`` where the broker offers it, except for a static member where the
    broker also offers ``classic``. Under KIP-848 the broker refuses a static member's name to
    its replacement until the killed process's session has expired (UNRELEASED_INSTANCE_ID), so
    a crash loop stalls that member's partitions for the whole session timeout; under the
    classic protocol the replacement takes the slot over at once. Measured with
    ``make bench-membership`` (docs/benchmarks.md): longest partition stall 10.7 s under
    ``consumer``, 1.9 s under ``classic``.

    Raises:
        ConfigError: ``group.protocol`` in ``PIPELINE_KAFKA__CLIENT`` is neither protocol.
    """
    forced = settings.client.get("group.protocol")
    if forced is not None:
        if forced not in ("consumer", "classic"):
            raise ConfigError(
                f"{CLIENT_VARIABLE}: group.protocol={forced!r} is not a protocol"
                " (use consumer or classic, or set PIPELINE_KAFKA__GROUP_PROTOCOL)"
            )
        return "consumer" if forced == "consumer" else "classic"
    if settings.group_protocol != "auto":
        return settings.group_protocol
    offered = broker_protocols(settings)
    if "consumer" in offered and not (static and "classic" in offered):
        return "consumer"
    return "classic"


TOPIC_REFRESH_MS = 5000
"""How often a member's client reads its topics' metadata again. A classic group gives out
partitions ``pipeline topics apply`` added only once a member's client sees the new count, and
librdkafka's default (300 s) left them unread that long while producers already sent there;
Redis Streams members and producers re-read a topic's partitions every 5 s as well."""


def consumer_config(
    settings: KafkaSettings,
    group: str,
    member_id: str,
    *,
    protocol: Protocol = "classic",
    instance: str | None = None,
) -> dict[str, Any]:
    """Librdkafka properties of a group member (its :func:`client_properties` override them).

    Args:
        settings: the Kafka section of the settings.
        group: the group id.
        member_id: this member's name (in ``client.id``).
        protocol: the rebalance protocol (:func:`choose_protocol`).
        instance: the stable name for ``group.instance.id`` (static membership), or None.
    """
    config: dict[str, Any] = {
        "bootstrap.servers": settings.bootstrap_servers,
        "client.id": f"{settings.client_id}-{member_id}",
        "group.id": group,
        "group.protocol": protocol,
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "earliest",
        "socket.timeout.ms": settings.request_timeout_ms,
        "fetch.wait.max.ms": settings.fetch_wait_max_ms,
        "fetch.queue.backoff.ms": settings.fetch_queue_backoff_ms,
        "enable.partition.eof": False,
        "topic.metadata.refresh.interval.ms": TOPIC_REFRESH_MS,
        "logger": logging.getLogger("pipeline.librdkafka"),
    }
    if protocol == "classic":
        config["partition.assignment.strategy"] = "cooperative-sticky"
        config["session.timeout.ms"] = settings.session_timeout_ms
        config["heartbeat.interval.ms"] = max(settings.session_timeout_ms // 5, 100)
    if instance is not None:
        config["group.instance.id"] = instance
    return {**config, **client_properties(settings, "consumer")}


def client_error(
    exc: KafkaException, protocol: Protocol, settings: KafkaSettings
) -> ConfigError | None:
    """The one-line error for a member its properties could not build, if that is the cause."""
    text = str(exc.args[0].str() if exc.args and isinstance(exc.args[0], KafkaError) else exc)
    if protocol == "consumer" and any(p in text for p in CLASSIC_ONLY):
        hint = (
            "the consumer protocol (KIP-848) takes it from the broker: remove it, or set"
            " PIPELINE_KAFKA__GROUP_PROTOCOL=classic"
        )
        return client_config_error(exc, settings.client, hint)
    return client_config_error(exc, settings.client)
