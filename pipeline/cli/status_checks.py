"""Can ``pipeline status`` reach what it reads? If not, one line: what, where, what to do.

``pipeline status`` is the command the runbook sends an operator to when something is wrong, so
it must answer quickly and plainly when a service is down: :func:`reach_broker` asks the broker
for its metadata with a short timeout before anything else, and :func:`reach_redis` pings the
Redis that holds the throttles. Both raise :class:`~pipeline.errors.BrokerUnavailable` with a
message that names the service, its address, the variable that sets it and the fix. A broker
that answered but refused the credentials or the TLS handshake raises :class:`BrokerRefused`,
its subclass, so that a caller reads the refusal the probe found instead of working it out again.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from typing import TYPE_CHECKING

from redis import exceptions as rexc
from redis.asyncio import Redis

from pipeline.config import Settings
from pipeline.errors import BrokerUnavailable, ConfigError, PipelineError
from pipeline.reachability import Service, no_answer, refusal, unreachable
from pipeline.transport import create_transport

if TYPE_CHECKING:
    from pipeline.cli.kafka_listener import ListenerKind

__all__ = ["PROBE_TIMEOUT_MS", "BrokerRefused", "reach_broker", "reach_redis"]

PROBE_TIMEOUT_MS = 3_000
"""How long the first request to a broker may take before status says it is unreachable."""


class BrokerRefused(BrokerUnavailable):
    """The broker answered, but refused the credentials or the TLS handshake (a Redis).

    Its message is :func:`~pipeline.reachability.refusal`'s line: what was refused, where, what
    to change in the setting. Raised where the refusal was found, so it is worked out once.
    """


async def reach_broker(settings: Settings) -> None:
    """Raise :class:`BrokerUnavailable` unless the transport's broker answers within the probe.

    Reads only the cluster metadata (Kafka) or the topic registry (Redis); creates nothing.
    A Kafka whose every bootstrap address refuses a TCP connection is reported at once, without
    the metadata request (librdkafka would retry it for the whole probe). A Redis that refused
    the URL's credentials or its TLS handshake raises :class:`BrokerRefused`. A Kafka broker's
    refused login is not in its error: the error's ``diagnose`` asks the broker (up to 3 s), for
    the caller that wants to know; not when every address took no connection or said nothing to
    the listener probe (a port that speaks no Kafka, a hung broker), which no login could have
    refused: that second wait would end in the same line.
    """
    kafka = settings.kafka
    if settings.transport == "kafka":
        reason = await _no_address_answers(kafka.bootstrap_servers)
        if reason is not None:
            raise BrokerUnavailable(no_answer(settings, "kafka", reason))
    capped = kafka.model_copy(
        update={"request_timeout_ms": min(kafka.request_timeout_ms, PROBE_TIMEOUT_MS)}
    )
    transport = create_transport(settings.model_copy(update={"kafka": capped}))
    try:
        await transport.admin().list_topics(())
    except ConfigError:
        raise  # a bad setting (a refused client property): exit 2 with it, not "unreachable"
    except PipelineError as exc:
        reason = str(exc).removeprefix("list topics: ").removeprefix("redis unreachable: ")
        service: Service = "kafka" if transport.name == "kafka" else "redis"
        refused = refusal(settings, service, reason)
        if refused is not None:
            raise BrokerRefused(refused) from exc
        kinds = await _listeners(settings) if service == "kafka" else None
        other = _not_a_broker(settings, reason, kinds)
        if other is not None:  # no service to start: the address is another listener's
            raise BrokerUnavailable(other) from exc
        unavailable = BrokerUnavailable(no_answer(settings, service, reason))
        if kinds is None or kinds & {"broker", "other"}:  # one that said nothing refuses none
            unavailable.diagnose = getattr(exc, "diagnose", None)  # a refused login, asked for
        raise unavailable from exc
    finally:
        await transport.close()


LISTENER_WAIT_S = 1.0
"""How long a bootstrap address may take to answer the listener probe, each step."""
_ENCRYPTED = ("SSL", "SASL_SSL")


async def _listeners(settings: Settings) -> set[ListenerKind] | None:
    """What answered each bootstrap address's listener probe; None when it cannot be asked.

    After the metadata request failed: each address is asked what listens there
    (:func:`~pipeline.cli.kafka_listener.listener_kind`, in plain text, so not when
    ``security.protocol`` is TLS: then None). An address that took no connection adds nothing.
    """
    from pipeline.cli.kafka_listener import listener_kind, split_address  # noqa: PLC0415

    kafka = settings.kafka
    if str(kafka.client.get("security.protocol", "")).upper() in _ENCRYPTED:
        return None
    addresses = [
        found
        for entry in kafka.bootstrap_servers.split(",")
        if (found := split_address(entry)) is not None
    ]
    kinds = await asyncio.gather(*(listener_kind(h, p, LISTENER_WAIT_S) for h, p in addresses))
    return {kind for kind in kinds if kind is not None}


def _not_a_broker(
    settings: Settings, reason: str, answered: set[ListenerKind] | None
) -> str | None:
    """The line for bootstrap addresses that answer but are no broker's listener, else None.

    ``answered`` is what :func:`_listeners` found (None: not asked, or not Kafka). When one
    answered and none is a broker (a KRaft controller's listener, or another service),
    starting Kafka is the wrong advice: the address is. One that accepted and said nothing may
    be a hung broker: then the not-answering line stands.
    """
    if not answered or answered & {"broker", "unknown"}:  # a silent one may be a hung broker
        return None
    kafka = settings.kafka
    what = (
        "a KRaft controller's, which serves no metadata"
        if answered == {"controller"}
        else "it gave no Kafka answer"
    )
    variable = "PIPELINE_KAFKA__BOOTSTRAP_SERVERS"
    return (
        f"cannot use Kafka at {kafka.bootstrap_servers} ({variable}): something answers there"
        f" that is not a Kafka broker's listener ({what}; {reason.rstrip('. ')}); check the"
        f" listener: point {variable} at a broker's client listener (its advertised.listeners)"
    )


REFUSAL_WAIT_S = 0.5
"""How long a bootstrap address may take to accept or refuse a TCP connection in that check."""


async def _no_address_answers(servers: str) -> str | None:
    """Why no bootstrap server in ``servers`` can answer, when each refused or did not resolve.

    librdkafka retries a refused connection, or a name that does not resolve, until the
    metadata request's timeout (3 s in the probe) and then says only that it timed out: a Kafka
    that is down, when the name may be a typo. A port where nothing listens answers at once, and
    so does the resolver for a name it does not know. Any address that accepts, is slow, or
    whose lookup fails for another reason (DNS may recover) leaves the answer to the metadata
    request: only a refusal or an unknown name from every address settles it here.
    """
    entries = [e.strip() for e in servers.split(",") if e.strip()]
    if not entries:
        return None
    answers = await asyncio.gather(*(_refusal(entry) for entry in entries))
    reasons = [answer for answer in answers if answer is not None]
    if len(reasons) < len(answers):
        return None
    if all(reason == _REFUSED for reason in reasons):
        return "connection refused at every bootstrap address"
    return "; ".join(dict.fromkeys(reasons))


_REFUSED = "connection refused"


async def _refusal(entry: str) -> str | None:
    """How the bootstrap server ``entry`` (``[proto://]host[:port]``) turned a connection down.

    ``connection refused``, ``host 'H' does not resolve (...)``, or None: it accepted, was
    slow, or failed in a way that may not last.
    """
    address = entry.split("://", 1)[-1]
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():  # no port: librdkafka's default
        host, port = address, "9092"
    host = host.removeprefix("[").removesuffix("]")
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, int(port)), REFUSAL_WAIT_S)
    except ConnectionRefusedError:
        return _REFUSED
    except socket.gaierror as exc:
        if exc.errno in _UNKNOWN_NAME:
            return f"host {host!r} does not resolve ({exc.strerror})"
        return None  # a resolver that failed (EAI_AGAIN) may answer next time
    except (OSError, TimeoutError, ValueError):
        return None  # unreachable or slow: not a refusal
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return None


_UNKNOWN_NAME = {socket.EAI_NONAME, getattr(socket, "EAI_NODATA", socket.EAI_NONAME)}
"""The resolver's answers that the name has no address (not that it could not ask)."""


async def reach_redis(settings: Settings, client: Redis) -> None:
    """Raise :class:`BrokerUnavailable` unless Redis answers ``PING``."""
    try:
        await client.ping()
    except (rexc.RedisError, OSError, ValueError) as exc:
        raise BrokerUnavailable(unreachable(settings, "redis", str(exc))) from exc
