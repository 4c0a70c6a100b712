"""Translation of confluent-kafka errors into :mod:`pipeline.errors` at the boundary."""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING

from confluent_kafka import KafkaError, KafkaException, Producer

from pipeline.config import declare_hint
from pipeline.errors import (
    BrokerUnavailable,
    ConfigError,
    DeliveryFailed,
    MessageTooLarge,
    PipelineError,
    TransportError,
    UnknownTopic,
)

if TYPE_CHECKING:
    from pipeline.config import KafkaSettings

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
        unavailable = BrokerUnavailable(text)
        unavailable.diagnose = login_line
        return unavailable
    if code in _UNKNOWN_TOPIC:
        return UnknownTopic(f"{text} ({declare_hint()})")
    if code in _TOO_LARGE:
        return MessageTooLarge(text)
    return DeliveryFailed(text) if context.startswith("produce") else TransportError(text)


CLIENT_VARIABLE = "PIPELINE_KAFKA__CLIENT"
BOOTSTRAP_VARIABLE = "PIPELINE_KAFKA__BOOTSTRAP_SERVERS"

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


LOGIN_PROBE_S = 3.0
"""How long :func:`login_problem` listens to one client for the broker's answer."""
_SASL_REFUSAL = re.compile(r"(SASL authentication error: .*?)(?: \(after \d+ms in state \w+\))?$")
_CLOSED_BY_BROKER = "connection closed by peer"
_DOWN = ("Connection refused", "brokers are down", "Failed to resolve")


class _Heard:
    """The ``logger`` and ``error_cb`` of a probe: what librdkafka said that answers it.

    Each line is read once, as it comes: the probe asks :attr:`settled` after each 0.1 s poll,
    and no line is kept to be read again (nor joined with the others) at each.
    """

    __slots__ = ("closed_by_broker", "refused", "settled")

    def __init__(self) -> None:
        self.refused: str | None = None
        """The broker's refusal of the SASL login, when it said one."""
        self.closed_by_broker = False
        """Whether the broker answered, then closed the connection."""
        self.settled = False
        """Whether the broker's answer is known: a refused login, a closed or no connection."""

    def log(self, level: int, msg: str, *args: object) -> None:  # noqa: ARG002 - any level
        """One librdkafka log line."""
        line = msg % args if args else msg
        if _CLOSED_BY_BROKER in line:
            self.closed_by_broker = self.settled = True
        elif any(s in line for s in _DOWN):
            self.settled = True

    def error(self, err: KafkaError) -> None:
        """One client-level error; a refused SASL login is kept."""
        if err.code() == KafkaError._AUTHENTICATION:  # noqa: SLF001
            found = _SASL_REFUSAL.search(err.str())
            self.refused = found[1] if found else err.str()
            self.settled = True


def login_problem(settings: KafkaSettings, timeout_s: float = LOGIN_PROBE_S) -> str | None:
    """The line for a broker that refused this client's login or protocol, else None.

    librdkafka retries a refused SASL login without telling the caller: a request only times
    out. After a request timed out, one client with the same properties listens for up to
    ``timeout_s`` to what librdkafka reports (served by polling, which the admin client never
    does): a refused login names ``PIPELINE_KAFKA__CLIENT``'s keys to check (never their
    values); a broker that answers and closes the connection, a listener that may expect
    another ``security.protocol``. None when the broker said neither (down, or slow).
    """
    from pipeline.transport.kafka.group import client_properties  # noqa: PLC0415 - a cycle

    heard = _Heard()
    try:
        producer = Producer(
            {
                "bootstrap.servers": settings.bootstrap_servers,
                **client_properties(settings, "producer"),
                "logger": heard,
                "error_cb": heard.error,
            }
        )
    except KafkaException:  # properties it refuses: the command's own line says so
        return None
    deadline = time.monotonic() + timeout_s
    while not heard.settled and time.monotonic() < deadline:
        producer.poll(0.1)
    producer.poll(0)
    where = f"Kafka at {settings.bootstrap_servers} ({BOOTSTRAP_VARIABLE})"
    if heard.refused is not None:
        return (
            f"{where} refused the login: {heard.refused}; check sasl.username, sasl.password"
            f" and sasl.mechanism in {CLIENT_VARIABLE} against the users of its listener"
        )
    if heard.closed_by_broker:
        keys = sorted(k for k in settings.client if k.startswith(("security.", "sasl.", "ssl.")))
        return (
            f"{where} answered, then closed the connection: its listener may expect another"
            f" security.protocol (SASL or TLS); set security.protocol and the sasl.* or ssl.*"
            f" properties it needs in {CLIENT_VARIABLE} ({', '.join(keys) or 'none set'})"
        )
    return None


def login_line() -> str | None:
    """:func:`login_problem` for the process's settings; None when they cannot be read.

    Set as :attr:`BrokerUnavailable.diagnose <pipeline.errors.BrokerUnavailable.diagnose>` of
    the errors :func:`translate` makes, so a command's line can say a refused login.
    """
    from pipeline.config import load_settings  # noqa: PLC0415 - the settings, when asked

    try:
        return login_problem(load_settings().kafka)
    except PipelineError:  # a setting it cannot read, a client it cannot build
        return None
