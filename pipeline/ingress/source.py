"""A configured source turned into what a request needs: verifier, extractors, router, admission.

:func:`build_sources` runs at start; any problem (an undeclared topic, a bad secret, a body cap
above the broker's message size) is a :class:`~pipeline.errors.ConfigError` then, never a
request-time surprise. A source builds the log row of a verified request with
:meth:`Source.build_row`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pipeline.errors import ConfigError
from pipeline.ingress.admission import Admission
from pipeline.ingress.errors import Malformed
from pipeline.ingress.extract import Extractor, parse_pointer
from pipeline.ingress.ids import new_row_id
from pipeline.ingress.route import Condition, Route, Router
from pipeline.ingress.settings import AdmissionSettings, SourceConfig, ValueFrom
from pipeline.ingress.settings import Condition as ConditionConfig
from pipeline.ingress.verify import (
    HmacHeaderVerifier,
    HubSignatureVerifier,
    StandardWebhooksVerifier,
    StripeVerifier,
    UnverifiedVerifier,
    Verifier,
)
from pipeline.logstore import NewRow
from pipeline.topics.spec import TopicSpec

_HEADROOM_BYTES = 16_384  # key and headers of the produced event, beside the body

# Where each scheme's provider puts its event id when the source does not say.
_DEFAULT_EVENT_ID = {
    "github": ValueFrom(header="x-github-delivery"),
    "standard_webhooks": ValueFrom(header="webhook-id"),
    "stripe": ValueFrom(pointer="/id"),
}


@dataclass(frozen=True, slots=True)
class Source:
    """One ``/hooks/{name}`` endpoint, ready to serve."""

    name: str
    verifier: Verifier
    router: Router
    admission: Admission
    tenant: Extractor | None
    key: Extractor | None
    event_id: Extractor | None
    keep_headers: frozenset[str]
    max_body_bytes: int
    verify_token: str | None

    @property
    def needs_json(self) -> bool:
        """Whether the body must be JSON (something is read from it)."""
        extractors = (self.tenant, self.key, self.event_id)
        return self.router.needs_body or any(e is not None and e.needs_body for e in extractors)

    def build_row(self, headers: Mapping[str, str], body: bytes, now_s: float) -> NewRow:
        """The log row of a verified request received at ``now_s``.

        Without a configured (or scheme default) event id, the id is the SHA-256 of the body,
        so an exact redelivery is still deduplicated.

        Raises:
            Malformed: the body is not JSON although the source reads from it, or the
                configured event id is missing.
        """
        payload: Any = None
        if self.needs_json:
            try:
                payload = json.loads(body)
            except (ValueError, UnicodeDecodeError):
                raise Malformed("body is not JSON") from None
        route = self.router.route(payload)
        event_id = "sha256:" + hashlib.sha256(body).hexdigest()
        if self.event_id is not None:
            found = self.event_id.extract(payload, headers)
            if not found:
                raise Malformed("event id not found")
            event_id = found
        return NewRow(
            id=new_row_id(now_s),
            source=self.name,
            tenant=_value(self.tenant, payload, headers),
            key=_value(self.key, payload, headers),
            topic=route.topic,
            lane=route.lane,
            event_id=event_id,
            received_at_ms=int(now_s * 1000),
            headers={name: v for name, v in headers.items() if name in self.keep_headers},
            body=body,
        )


def build_sources(
    configs: Mapping[str, SourceConfig],
    specs: Sequence[TopicSpec],
    *,
    admission: AdmissionSettings,
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
            sources[name] = _build(name, config, lanes, admission, max_message_bytes)
        except ConfigError as exc:
            raise ConfigError(f"sources.{name}: {exc}") from None
    return sources


def _build(
    name: str,
    config: SourceConfig,
    lanes: Mapping[str, str],
    default_admission: AdmissionSettings,
    max_message_bytes: int,
) -> Source:
    if config.max_body_bytes > max_message_bytes - _HEADROOM_BYTES:
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
    limits = config.admission or default_admission
    event_id = config.event_id or _DEFAULT_EVENT_ID.get(config.scheme)
    return Source(
        name=name,
        verifier=verifier,
        router=Router(rules, route_to(config.topic, "topic")),
        admission=Admission(
            limits.max_in_flight, limits.queue_timeout_ms, limits.max_retry_after_s
        ),
        tenant=_extractor(config.tenant),
        key=_extractor(config.key),
        event_id=_extractor(event_id),
        keep_headers=frozenset(
            [*verifier.headers, *(h.lower() for h in config.keep_headers), "content-type"]
        ),
        max_body_bytes=config.max_body_bytes,
        verify_token=config.verify_token,
    )


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


def _value(extractor: Extractor | None, payload: Any, headers: Mapping[str, str]) -> str:
    if extractor is None:
        return ""
    return extractor.extract(payload, headers) or ""
