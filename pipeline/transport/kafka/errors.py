"""Translation of confluent-kafka errors into :mod:`pipeline.errors` at the boundary."""

from __future__ import annotations

import re
from collections.abc import Mapping

from confluent_kafka import KafkaError, KafkaException

from pipeline.errors import (
    BrokerUnavailable,
    ConfigError,
    DeliveryFailed,
    MessageTooLarge,
    TransportError,
    UnknownTopic,
)

_UNAVAILABLE = {
    KafkaError._TRANSPORT,  # noqa: SLF001 - librdkafka's local error codes are "private" names
    KafkaError._ALL_BROKERS_DOWN,  # noqa: SLF001
    KafkaError._TIMED_OUT,  # noqa: SLF001
    KafkaError._MSG_TIMED_OUT,  # noqa: SLF001
    KafkaError.REQUEST_TIMED_OUT,
    KafkaError.NETWORK_EXCEPTION,
}
_UNKNOWN_TOPIC = {
    KafkaError.UNKNOWN_TOPIC_OR_PART,
    KafkaError._UNKNOWN_TOPIC,  # noqa: SLF001
    KafkaError._UNKNOWN_PARTITION,  # noqa: SLF001
}
_TOO_LARGE = {
    KafkaError.MSG_SIZE_TOO_LARGE,
    KafkaError.RECORD_LIST_TOO_LARGE,
}


def translate(error: KafkaError | KafkaException, context: str) -> TransportError:
    """Map a confluent-kafka error to the matching :class:`~pipeline.errors.TransportError`."""
    err = error.args[0] if isinstance(error, KafkaException) else error
    if not isinstance(err, KafkaError):
        return TransportError(f"{context}: {error}")
    code = err.code()
    text = f"{context}: {err.str()}"
    if code in _UNAVAILABLE:
        return BrokerUnavailable(text)
    if code in _UNKNOWN_TOPIC:
        return UnknownTopic(f"{text} (declare it in topics/ and run `pipeline topics apply`)")
    if code in _TOO_LARGE:
        return MessageTooLarge(text)
    return DeliveryFailed(text) if context.startswith("produce") else TransportError(text)


CLIENT_VARIABLE = "PIPELINE_KAFKA__CLIENT"

ALIASES = {
    "acks": "request.required.acks",
    "bootstrap.servers": "metadata.broker.list",
    "compression.type": "compression.codec",
    "delivery.timeout.ms": "message.timeout.ms",
    "linger.ms": "queue.buffering.max.ms",
    "max.in.flight": "max.in.flight.requests.per.connection",
    "max.partition.fetch.bytes": "fetch.message.max.bytes",
    "retries": "message.send.max.retries",
    "sasl.mechanism": "sasl.mechanisms",
}
"""librdkafka's aliases and the property each stands for, which its errors name instead."""


def client_config_error(
    exc: KafkaException, client: Mapping[str, str], hint: str = "fix or remove it"
) -> ConfigError | None:
    """The one-line error for a client its properties could not build, if that is the cause.

    librdkafka checks every property when a client is built and names the one at fault; the
    properties come from the defaults and ``client`` (``PIPELINE_KAFKA__CLIENT``). Where the
    user set an alias (``linger.ms``), librdkafka names the property it stands for
    (``queue.buffering.max.ms``): the line names the alias, as written, with it.
    """
    err = exc.args[0] if exc.args else None
    if not isinstance(err, KafkaError) or err.code() != KafkaError._INVALID_ARG:  # noqa: SLF001
        return None
    reason = re.sub(r"^Failed to create (consumer|producer): ", "", err.str().strip())
    for alias, canonical in ALIASES.items():
        if alias in client and canonical not in client:
            reason = re.sub(
                rf"([\"`]){re.escape(canonical)}\1",
                rf"\g<1>{alias}\g<1> (librdkafka's {canonical})",
                reason,
            )
    return ConfigError(f"{CLIENT_VARIABLE}: {' '.join(reason.split())} ({hint})")
