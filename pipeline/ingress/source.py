"""A configured source turned into what a request needs: verifier, extractors, router, admission.

:func:`build_sources` runs at start; any problem (an undeclared topic, a bad secret, a body cap
above the broker's message size) is a :class:`~pipeline.errors.ConfigError` then, never a
request-time surprise. A source builds the log row of a verified request with
:meth:`Source.build_row`.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import parse_qs

from pipeline import tracing
from pipeline.config import IngressSlotSettings
from pipeline.errors import ConfigError
from pipeline.ingress.errors import Malformed
from pipeline.ingress.extract import Extractor, parse_pointer
from pipeline.ingress.ids import new_row_id
from pipeline.ingress.route import Condition, Route, RouteRules
from pipeline.ingress.settings import Condition as ConditionConfig
from pipeline.ingress.settings import SourceConfig, ValueFrom
from pipeline.ingress.slots import SourceSlots
from pipeline.ingress.values import MAX_KEPT_HEADER_CHARS, checked
from pipeline.ingress.verify import (
    HmacHeaderVerifier,
    HubSignatureVerifier,
    StandardWebhooksVerifier,
    StripeVerifier,
    UnverifiedVerifier,
    Verifier,
)
from pipeline.logstore import NewRow
from pipeline.offload.caps import inline_cap_bytes
from pipeline.topics.spec import TopicSpec
from pipeline.transport.protocol import Admin

log = logging.getLogger(__name__)

HEADROOM_BYTES = 16_384
"""Room for the produced event's key and headers beside the body."""

_FORM = "application/x-www-form-urlencoded"
_CHECK_TIMEOUT_S = 10.0

# Unsigned, but useful to trace a delivery back to the provider's log.
_KEEP_BY_SCHEME = {"github": ("x-github-delivery", "x-github-event")}

# Where each scheme's provider puts a *signed* event id when the source does not say. GitHub's
# X-GitHub-Delivery is outside the signature, so GitHub deliveries dedupe on the body's hash.
_DEFAULT_EVENT_ID = {
    "standard_webhooks": Extractor(header="webhook-id", fallback="svix-id"),
    "stripe": Extractor(pointer=("id",)),
}


@dataclass(frozen=True, slots=True)
class Source:
    """One ``/hooks/{name}`` endpoint, ready to serve."""

    name: str
    verifier: Verifier
    router: RouteRules
    admission: SourceSlots
    tenant: Extractor | None
    key: Extractor | None
    event_id: Extractor | None
    keep_headers: frozenset[str]
    max_body_bytes: int
    verify_token: str | None
    offloads: bool = False
    """Its cap passes the message size, which offloading every topic it routes to allows."""
    needs_json: bool = field(init=False, repr=False, compare=False)
    """Whether the body must be JSON (something is read from it); set once, read per request."""

    def __post_init__(self) -> None:
        """Work out :attr:`needs_json` from the extractors and the routes."""
        extractors = (self.tenant, self.key, self.event_id)
        needs = self.router.needs_body or any(e is not None and e.needs_body for e in extractors)
        object.__setattr__(self, "needs_json", needs)

    @property
    def topics(self) -> frozenset[str]:
        """Every topic this source may route to."""
        return frozenset([self.router.default.topic, *(r.topic for _, r in self.router.rules)])

    def build_row(
        self,
        headers: Mapping[str, str],
        body: bytes,
        now_s: float,
        *,
        body_sha256: str | None = None,
    ) -> NewRow:
        """The log row of a verified request received at ``now_s``.

        The event id is the configured (or scheme default) one when the request has it, else
        the SHA-256 of the body, so an exact redelivery is still deduplicated and a valid
        delivery without the id (a WhatsApp status, a Clerk ``svix-id``) is not refused.
        A form-encoded body (GitHub's ``payload=<json>`` option) is read through its
        ``payload`` field. ``body_sha256``: the body's SHA-256 (hex) if the caller already
        computed it from these bytes. With tracing on, the kept headers also carry the request
        span's ``traceparent`` (:func:`pipeline.tracing.outgoing`), so every produce of the row
        continues the request's trace.

        Raises:
            Malformed: the body is not JSON (or nested too deeply, itself or a value read
                from it as an id) although the source reads from it, or a tenant, key, event
                id or kept header is not storable (:func:`pipeline.ingress.values.checked`).
        """
        payload: Any = None
        if self.needs_json:
            payload = _parse(headers, body)
        try:
            route = self.router.route(payload)
            event_id = None if self.event_id is None else self.event_id.extract(payload, headers)
            tenant = _value(self.tenant, payload, headers)
            key = _value(self.key, payload, headers)
        except RecursionError:  # an object value the parser read, too deep to write as its id
            raise Malformed("body is nested too deeply") from None
        if not event_id:
            event_id = "sha256:" + (body_sha256 or hashlib.sha256(body).hexdigest())
        kept: Mapping[str, str] = {
            name: v for name, v in headers.items() if name in self.keep_headers
        }
        for name, value in kept.items():
            checked(f"header {name}", value, MAX_KEPT_HEADER_CHARS)
        tenant = checked("tenant", tenant)
        if tracing.on():  # the row keeps the request's trace context for every produce
            kept = tracing.outgoing(kept, tenant)
        return NewRow(
            id=new_row_id(now_s),
            source=self.name,
            tenant=tenant,
            key=checked("key", key),
            topic=route.topic,
            lane=route.lane,
            event_id=checked("event id", event_id),
            received_at_ms=int(now_s * 1000),
            headers=kept,
            body=body,
        )


def _parse(headers: Mapping[str, str], body: bytes) -> Any:
    """The JSON document of ``body`` (or of its form field ``payload``).

    The body is UTF-8 without a byte order mark (RFC 8259), as the consumers read the value:
    ``json.loads`` of bytes would guess UTF-16 or UTF-32 and skip a BOM, where a typed handler's
    ``model_validate_json`` takes none of them, so such a body would be accepted, then
    dead-lettered by every consumer instead of refused where its sender sees it.
    """
    try:
        text = body.decode("utf-8")  # strict: no lone surrogates either
        if headers.get("content-type", "").lower().startswith(_FORM):
            fields = parse_qs(text, max_num_fields=64)
            if "payload" not in fields:
                raise Malformed("body is not JSON")
            return json.loads(fields["payload"][0])
        return json.loads(text)  # a str that starts with a BOM is a JSONDecodeError
    except RecursionError:
        raise Malformed("body is nested too deeply") from None
    except (ValueError, UnicodeDecodeError):
        raise Malformed("body is not JSON") from None


def build_sources(
    configs: Mapping[str, SourceConfig],
    specs: Sequence[TopicSpec],
    *,
    admission: IngressSlotSettings,
    max_message_bytes: int,
) -> dict[str, Source]:
    """Build every source; ``specs`` are the declared topics (their lanes come from there).

    Raises:
        ConfigError: a route names an undeclared topic, a secret is invalid for its scheme,
            or a body cap leaves no room under ``max_message_bytes``.
    """
    lanes = {spec.name: spec.lane for spec in specs}
    sources = {}
    for name, config in configs.items():
        try:
            # Where every topic of the source offloads, the cap is the reference's, not the body's.
            inline = max_message_bytes - HEADROOM_BYTES
            cap = inline_cap_bytes(config, specs, inline)
            source = _build(name, config, lanes, admission, cap + HEADROOM_BYTES)
            sources[name] = replace(source, offloads=config.max_body_bytes > inline)
        except ConfigError as exc:
            raise ConfigError(f"sources.{name}: {exc}") from None
    return sources


def _build(
    name: str,
    config: SourceConfig,
    lanes: Mapping[str, str],
    default_admission: IngressSlotSettings,
    max_message_bytes: int,
) -> Source:
    if config.max_body_bytes > max_message_bytes - HEADROOM_BYTES:
        raise ConfigError(
            f"max_body_bytes={config.max_body_bytes} leaves no room for the event's key and "
            f"headers under PIPELINE_MAX_MESSAGE_BYTES={max_message_bytes}"
        )

    def route_to(topic: str, field: str) -> Route:
        if topic not in lanes:
            raise ConfigError(f"{field}: topic {topic!r} is not declared in the topics directory")
        return Route(topic, lanes[topic])

    rules = [
        (_condition(rule.when), route_to(rule.topic, f"routes[{i}].topic"))
        for i, rule in enumerate(config.routes)
    ]
    verifier = build_verifier(config)
    limits = default_admission
    if config.admission is not None:  # the fields it sets; the others stay the environment's
        limits = limits.model_copy(update=config.admission.model_dump(exclude_unset=True))
    event_id = _extractor(config.event_id) or _DEFAULT_EVENT_ID.get(config.scheme)
    if config.scheme != "none":
        event_id = _signed_event_id(name, event_id, verifier.signed_headers)
        if config.tenant is not None and config.tenant.header is not None:
            log.warning(
                "sources.%s: tenant comes from the unsigned header %s: anyone holding one "
                "signed body can file it under another tenant; read it from the body instead",
                name,
                config.tenant.header.lower(),
            )
    return Source(
        name=name,
        verifier=verifier,
        router=RouteRules(rules, route_to(config.topic, "topic")),
        admission=SourceSlots(
            limits.max_in_flight, limits.queue_timeout_ms, limits.max_retry_after_s
        ),
        tenant=_extractor(config.tenant),
        key=_extractor(config.key),
        event_id=event_id,
        keep_headers=frozenset(
            [
                *verifier.headers,
                *_KEEP_BY_SCHEME.get(config.scheme, ()),
                *(h.lower() for h in config.keep_headers),
                "content-type",
                "content-encoding",  # the body stays as sent: its event says how it is encoded
            ]
        ),
        max_body_bytes=config.max_body_bytes,
        verify_token=config.verify_token,
    )


async def check_topic_limits(sources: Mapping[str, Source], admin: Admin) -> None:
    """Refuse to start when a source could accept a body its topics cannot take.

    A 2xx must never be given for what cannot be produced: with a Kafka topic at the broker's
    default ``max.message.bytes`` (1,048,588), a 1 MiB webhook would be accepted, then abandoned.

    The broker being down must not stop the ingress (accepting works without it): then the
    check is skipped with a warning, and the sweeper's produce reports any oversized row.

    Raises:
        ConfigError: a source's ``max_body_bytes`` plus room for key and headers is above the
            ``max.message.bytes`` of a topic it routes to.
    """
    names = sorted({topic for source in sources.values() for topic in source.topics})
    try:
        async with asyncio.timeout(_CHECK_TIMEOUT_S):
            infos = await admin.list_topics(names)
    except Exception as exc:  # any broker failure only skips a best-effort check
        limits_not_checked(str(exc) or f"no answer within {_CHECK_TIMEOUT_S:g} s")
        return
    problems = [
        f"sources.{source.name}: max_body_bytes={source.max_body_bytes} plus {HEADROOM_BYTES} "
        f"bytes of key and headers is above max.message.bytes={info.max_message_bytes} of topic "
        f"{topic!r}: lower max_body_bytes, or raise the topic's limit (`pipeline topics apply` "
        "sets it to PIPELINE_MAX_MESSAGE_BYTES)"
        for source in sources.values()
        for topic in sorted(source.topics)
        if (info := infos.get(topic)) is not None
        and info.max_message_bytes is not None
        and source.max_body_bytes + HEADROOM_BYTES > info.max_message_bytes
        and not source.offloads
    ]
    if problems:
        raise ConfigError("; ".join(problems))


def limits_not_checked(reason: str) -> None:
    """Say that the topics' size limits were skipped: the broker did not answer (``reason``)."""
    log.warning("topic size limits not checked (broker unreachable): %s", reason)


def build_verifier(config: SourceConfig) -> Verifier:
    """The verifier of a source's scheme; fails closed (ConfigError) when misconfigured."""
    if config.scheme != "none" and not all(config.secrets):
        raise ConfigError(f"scheme {config.scheme!r} needs non-empty secrets")
    match config.scheme:
        case "meta" | "github":
            return HubSignatureVerifier(config.secrets)
        case "stripe":
            return StripeVerifier(config.secrets, config.tolerance_s)
        case "standard_webhooks":
            return StandardWebhooksVerifier(config.secrets, config.tolerance_s)
        case "hmac" if config.hmac is not None:
            options = config.hmac
            return HmacHeaderVerifier(
                config.secrets,
                header=options.header,
                algorithm=options.algorithm,
                encoding=options.encoding,
                prefix=options.prefix,
            )
        case "none":
            return UnverifiedVerifier()
    raise ConfigError(f"no verifier for scheme {config.scheme!r}")  # fail closed


def _condition(config: ConditionConfig) -> Condition:
    pointer = parse_pointer(config.pointer)
    if config.exists is not None:
        return Condition(pointer, exists=config.exists)
    if config.in_ is not None:
        return Condition(pointer, one_of=frozenset(config.in_))
    return Condition(pointer, equals=config.equals)


def _extractor(config: ValueFrom | None) -> Extractor | None:
    if config is None:
        return None
    if config.pointer is not None:
        return Extractor(pointer=parse_pointer(config.pointer))
    if config.header is not None:
        return Extractor(header=config.header.lower())
    return Extractor(constant=config.value)


def _signed_event_id(
    name: str, extractor: Extractor | None, signed: frozenset[str]
) -> Extractor | None:
    """``extractor``, or None (dedupe on the body's hash) when it reads an unsigned header.

    An id outside the signature lets one captured body be accepted again under any id.
    """
    if extractor is None or extractor.header is None or extractor.header in signed:
        return extractor
    log.warning(
        "sources.%s: event_id comes from the unsigned header %s; deduplicating on the "
        "signed body's SHA-256 instead (read the id from the body to use it)",
        name,
        extractor.header,
    )
    return None


def _value(extractor: Extractor | None, payload: Any, headers: Mapping[str, str]) -> str:
    if extractor is None:
        return ""
    return extractor.extract(payload, headers) or ""
