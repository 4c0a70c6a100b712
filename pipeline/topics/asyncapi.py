"""An AsyncAPI 3.0 document of the declared topics: ``pipeline asyncapi``.

Each declaration (``topics/*.yaml``) becomes channels for its main topic, each retry tier and
its dead-letter topic; each lane becomes the operations of its consumer group (receive from
the main topic and the tiers, send to the tiers and the dead-letter topic) and of its
producers (send to the main topic). Messages carry the pipeline's headers
(:mod:`pipeline.headers`: tenant, event id, deadline, attempt, origin, error) and the payload
schema: the Avro record registered under the declaration's ``schema:`` subject when
``schemas/`` has it, else the pydantic model the lane's handler takes (``--app``), else none.
Servers are the Kafka bootstrap server and the Redis server of the settings (``kafka-secure``
and ``rediss`` for TLS ones; the Kafka server's SASL mechanism as its security scheme).

The document is checked with the official ``@asyncapi/parser`` in ``tests/topics``.
"""

from __future__ import annotations

import json
import re
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from pydantic import BaseModel, RootModel

from pipeline import headers as h
from pipeline.errors import ConfigError
from pipeline.event_bodies import body_kind
from pipeline.offload import reference
from pipeline.offload.policy import format_size_bytes
from pipeline.topics.asyncapi_headers import DEAD_LETTER_HEADERS, EVENT_HEADERS, RETRY_HEADERS
from pipeline.topics.spec import TopicSpec, format_duration_ms

ASYNCAPI_VERSION = "3.0.0"
KAFKA_BINDING = "0.5.0"
AVRO_FORMAT = "application/vnd.apache.avro+json;version=1.9.0"
KAFKA_PROTOCOLS = {
    "PLAINTEXT": "kafka",
    "SSL": "kafka-secure",
    "SASL_PLAINTEXT": "kafka",
    "SASL_SSL": "kafka-secure",
}
"""librdkafka's ``security.protocol`` values and AsyncAPI's protocol names for them."""
SASL_SCHEMES = {
    "GSSAPI": "gssapi",
    "PLAIN": "plain",
    "SCRAM-SHA-256": "scramSha256",
    "SCRAM-SHA-512": "scramSha512",
    "OAUTHBEARER": "oauth2",
}
"""librdkafka's SASL mechanisms and AsyncAPI's security scheme types for them."""
KAFKA_SCHEME = "kafkaSasl"
Schema = dict[str, Any]


def avro_schemas(directory: Path) -> dict[str, Schema]:
    """The Avro records of ``directory``'s ``*.avsc`` files by full name (their subject).

    A missing directory has none.

    Raises:
        ConfigError: a file cannot be read, is not JSON, or holds no JSON object (a record);
            the message names the file.
    """
    out: dict[str, Schema] = {}
    for path in sorted(directory.glob("*.avsc")) if directory.is_dir() else []:
        schema = _schema_file(path)
        name = schema.get("name", path.stem)
        namespace = schema.get("namespace")
        out[f"{namespace}.{name}" if namespace and "." not in name else name] = schema
    return out


def _schema_file(path: Path) -> Schema:
    """The JSON object of one ``.avsc`` file."""
    try:
        schema = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the schema file: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text: {exc.reason}") from None
    except ValueError as exc:
        raise ConfigError(f"{path}: not valid JSON: {exc}") from None
    if not isinstance(schema, dict):
        raise ConfigError(
            f"{path}: expected a JSON object (an Avro record), got a {type(schema).__name__}"
        )
    return schema


class JsonObject(RootModel[dict[str, Any]]):
    """Any JSON object: the lane's handler takes a dict, the value parsed as JSON."""


class Text(RootModel[str]):
    """UTF-8 text, the whole value as is (text/plain, not a quoted JSON string).

    The lane's handler takes a str.
    """


def model_of(event: Any) -> type[BaseModel] | None:
    """The pydantic model of a lane's event annotation (``Lane.event``: a turn's items), if any.

    The annotation as the App resolved it when the handler was registered: a handler whose
    other annotations are imported only for type checking, a ``functools.partial`` or an object
    with ``__call__`` is read as the runtime reads it. A handler of ``dict`` (``dict[str, Any]``,
    ``Mapping[str, Any]``) is described by :class:`JsonObject`, one of ``str`` by :class:`Text`
    (the annotations :func:`pipeline.runtime.app.body_adapter` decodes); bytes, a message or
    ``Any`` by none.
    """
    if typing.get_origin(event) is list:  # an annotation given as is
        event = (typing.get_args(event) or (None,))[0]
    if isinstance(event, type) and issubclass(event, BaseModel):
        return event
    body = body_kind(event)
    if body == "text":
        return Text
    if body == "object":
        return JsonObject
    return None


def _ident(name: str) -> str:
    """A component or channel id from a topic or lane name (letters, digits, ``_``, ``-``)."""
    return re.sub(r"[^A-Za-z0-9_-]", "_", name)


def kafka_security(client: Mapping[str, str]) -> tuple[str, str | None]:
    """The security protocol and SASL mechanism of ``PIPELINE_KAFKA__CLIENT``'s properties.

    ``security.protocol`` (default ``PLAINTEXT``) and, for ``SASL_*``, ``sasl.mechanism`` or
    its alias ``sasl.mechanisms`` (default ``GSSAPI``, as in librdkafka), both upper-cased; the
    mechanism is None without SASL. No credential is read.

    Raises:
        ConfigError: a protocol or mechanism librdkafka does not know; the message names it.
    """
    protocol = client.get("security.protocol", "PLAINTEXT").upper()
    if protocol not in KAFKA_PROTOCOLS:
        raise ConfigError(
            f"PIPELINE_KAFKA__CLIENT: security.protocol {protocol!r} is not one of "
            f"{', '.join(KAFKA_PROTOCOLS)}"
        )
    if not protocol.startswith("SASL_"):
        return protocol, None
    mechanism = client.get("sasl.mechanism", client.get("sasl.mechanisms", "GSSAPI")).upper()
    if mechanism not in SASL_SCHEMES:
        raise ConfigError(
            f"PIPELINE_KAFKA__CLIENT: sasl.mechanism {mechanism!r} is not one of "
            f"{', '.join(SASL_SCHEMES)}"
        )
    return protocol, mechanism


def _kafka_scheme(mechanism: str) -> Schema:
    """The AsyncAPI security scheme of a SASL mechanism."""
    scheme: Schema = {
        "type": SASL_SCHEMES[mechanism],
        "description": f"SASL {mechanism}, as `sasl.mechanism` in PIPELINE_KAFKA__CLIENT.",
    }
    if mechanism == "OAUTHBEARER":
        scheme["flows"] = {}  # the token comes from the client's own sasl.oauthbearer.* setup
    return scheme


def _kafka_server(bootstrap: str, protocol: str, mechanism: str | None) -> dict[str, Any]:
    """The Kafka server: ``kafka-secure`` over TLS (AsyncAPI's name), its SASL scheme if any."""
    description = "Apache Kafka: a topic's partitions are Kafka partitions."
    if protocol.endswith("SSL"):
        description += " Over TLS."
    server: dict[str, Any] = {
        "host": bootstrap.split(",", maxsplit=1)[0],
        "protocol": KAFKA_PROTOCOLS[protocol],
        "description": description,
    }
    if mechanism is not None:
        server["security"] = [{"$ref": f"#/components/securitySchemes/{KAFKA_SCHEME}"}]
    return server


def _redis_server(redis_url: str) -> dict[str, Any]:
    """The Redis server of ``redis_url`` (its password left out).

    ``rediss://`` is TLS: its protocol is ``rediss``, as AsyncAPI names the TLS variant of a
    protocol apart (``amqps``, ``kafka-secure``, ``wss``). An IPv6 address is bracketed before
    its port; a ``unix://`` socket is ``localhost`` with the socket's path.
    """
    redis = urlparse(redis_url)
    description = "Redis Streams: a stream per partition, owned by a group member."
    if redis.scheme == "unix":
        return {
            "host": "localhost",
            "protocol": "redis",
            "pathname": redis.path,
            "description": f"{description} Over the Unix socket `{redis.path}`.",
        }
    hostname = redis.hostname or "127.0.0.1"
    if ":" in hostname:
        hostname = f"[{hostname}]"
    return {
        "host": f"{hostname}:{redis.port or 6379}",
        "protocol": "rediss" if redis.scheme == "rediss" else "redis",
        "pathname": redis.path or "/0",
        "description": description + (" Over TLS." if redis.scheme == "rediss" else ""),
    }


def _describe(spec: TopicSpec) -> str:
    parts = [
        f"Lane `{spec.lane}`: {spec.partitions} partition{'' if spec.partitions == 1 else 's'}, "
        "keyed with Java-compatible murmur2; "
        + (
            "messages of one key are handled one at a time, in order."
            if spec.ordered
            else "messages are handled concurrently, in no particular order."
        )
    ]
    if spec.retention_ms:
        parts.append(f"Retention {format_duration_ms(spec.retention_ms)}.")
    if spec.retry.tiers_ms:
        tiers = ", ".join(format_duration_ms(t) for t in spec.retry.tiers_ms)
        parts.append(
            f"Retry tiers {tiers}; {spec.retry.max_attempts} attempts, then `{spec.dead_letter}`."
        )
    if spec.max_age_ms:
        parts.append(f"Expired after {format_duration_ms(spec.max_age_ms)} ({spec.on_expiry}).")
    if spec.throttle:
        parts.append(f"Throttled on keys {', '.join(spec.throttle.keys)}.")
    if spec.debounce:
        d = spec.debounce
        parts.append(
            f"Debounced by `{d.key}`: one turn {d.quiet_s:g} s after a conversation's last "
            f"message, at most {d.max_wait_s:g} s after its first, at most {d.max_batch} messages."
        )
    if spec.offload:
        parts.append(
            f"Payloads above {format_size_bytes(spec.offload.above_bytes)} travel by reference to "
            f"{spec.offload.store}: the body is then a JSON reference, marked by header "
            f"{reference.OFFLOAD}."
        )
    if spec.batch:
        parts.append(
            f"Batch lane: runs below {spec.batch.idle_below:g} of capacity, "
            f"done within {format_duration_ms(spec.batch.sla_ms)}."
        )
    return " ".join(parts)


def _extension(spec: TopicSpec) -> dict[str, Any]:
    """The declaration itself, as ``x-pipeline`` (what AsyncAPI has no field for)."""
    return spec.model_dump(mode="json", by_alias=True, exclude_none=True)


def _kafka_channel(topic: str, spec: TopicSpec, retention_ms: int | None) -> dict[str, Any]:
    binding: dict[str, Any] = {
        "topic": topic,
        "partitions": spec.partitions,
        "bindingVersion": KAFKA_BINDING,
    }
    if retention_ms is not None:
        binding["topicConfiguration"] = {"retention.ms": retention_ms}
    return {"kafka": binding}


class _Builder:
    """Accumulates channels, operations and components; one instance per document."""

    def __init__(self, avro: Mapping[str, Schema], models: Mapping[str, type[BaseModel]]) -> None:
        self.avro = avro
        self.models = models
        self.channels: dict[str, Any] = {}
        self.operations: dict[str, Any] = {}
        self.messages: dict[str, Any] = {}
        self.schemas: dict[str, Any] = {
            "EventHeaders": EVENT_HEADERS,
            "RetryHeaders": RETRY_HEADERS,
            "DeadLetterHeaders": DEAD_LETTER_HEADERS,
        }

    def payload(self, spec: TopicSpec) -> tuple[str | None, Any]:
        """Content type and payload of the lane's events."""
        record = self.avro.get(spec.schema_subject) if spec.schema_subject else None
        if record is not None:
            return "application/vnd.apache.avro", {"schemaFormat": AVRO_FORMAT, "schema": record}
        model = self.models.get(spec.lane)
        if model is None:
            return None, None
        named = _model_schemas(model, "")
        if any(self.schemas.get(name, definition) != definition for name, definition in named):
            # Another lane's model (or a header schema) has this name: this lane's schemas go
            # under its own, ``<lane>.<Model>`` (no Python class name has a dot).
            named = _model_schemas(model, f"{_ident(spec.lane)}.")
        self.schemas.update(named)
        content_type = "text/plain" if model is Text else "application/json"  # UTF-8 as sent
        return content_type, {"$ref": f"#/components/schemas/{named[-1][0]}"}

    def lane(self, spec: TopicSpec, group: str) -> None:
        """Channels, messages and operations of one declaration."""
        lane = _ident(spec.lane)
        content_type, payload = self.payload(spec)
        kinds = {
            "event": ("EventHeaders", f"An event of lane {spec.lane}."),
            "retry": ("RetryHeaders", f"A retry of an event of lane {spec.lane}."),
            "dead_letter": ("DeadLetterHeaders", f"An event of lane {spec.lane} that failed."),
        }
        for kind, (headers, summary) in kinds.items():
            message: dict[str, Any] = {
                "name": f"{lane}_{kind}",
                "summary": summary,
                "headers": {"$ref": f"#/components/schemas/{headers}"},
                "correlationId": {"location": f"$message.header#/{h.EVENT_ID}"},
                "bindings": {
                    "kafka": {
                        "key": {"type": "string", "description": _key_description(spec)},
                        "bindingVersion": KAFKA_BINDING,
                    }
                },
            }
            if content_type is not None:
                message["contentType"] = content_type
                message["payload"] = payload
            self.messages[f"{lane}_{kind}"] = message
        main = self.channel(spec.name, spec, spec.retention_ms, "event", _describe(spec))
        self.channels[main]["x-pipeline"] = _extension(spec)
        self.operation(f"{lane}_produce", "send", main, "event", f"Produce events of {spec.lane}.")
        self.operation(
            f"{lane}_consume",
            "receive",
            main,
            "event",
            f"Consumer group {group} handles them.",
            group=group,
        )
        for topic, tier_ms in zip(spec.retry_topic_names(), spec.retry.tiers_ms, strict=True):
            delay = format_duration_ms(tier_ms)
            half = format_duration_ms(tier_ms // 2)
            text = (
                f"Retry tier {delay} of lane {spec.lane}: due between {half} and {delay} after "
                f"the failure (header {h.DUE_MS}); never handled earlier."
            )
            tier = self.channel(topic, spec, spec.retention_ms, "retry", text)
            self.operation(f"{tier}_route", "send", tier, "retry", "The runtime retries here.")
            self.operation(
                f"{tier}_consume",
                "receive",
                tier,
                "retry",
                f"Consumer group {group} retries.",
                group=group,
            )
        dlq = self.channel(
            spec.dead_letter,
            spec,
            None,
            "dead_letter",
            f"Dead letters of lane {spec.lane}: `pipeline redrive {spec.dead_letter}` sends them "
            "back to their origin.",
        )
        self.operation(f"{lane}_dead_letter", "send", dlq, "dead_letter", "What cannot succeed.")

    def channel(
        self, topic: str, spec: TopicSpec, retention_ms: int | None, kind: str, text: str
    ) -> str:
        cid = _ident(topic)
        self.channels[cid] = {
            "address": topic,
            "title": topic,
            "description": text,
            "messages": {kind: {"$ref": f"#/components/messages/{_ident(spec.lane)}_{kind}"}},
            "bindings": _kafka_channel(topic, spec, retention_ms),
        }
        return cid

    def operation(
        self, oid: str, action: str, channel: str, kind: str, text: str, *, group: str | None = None
    ) -> None:
        op: dict[str, Any] = {
            "action": action,
            "channel": {"$ref": f"#/channels/{channel}"},
            "summary": text,
            "messages": [{"$ref": f"#/channels/{channel}/messages/{kind}"}],
        }
        if group is not None:
            op["bindings"] = {
                "kafka": {
                    "groupId": {"type": "string", "enum": [group]},
                    "bindingVersion": KAFKA_BINDING,
                }
            }
        self.operations[oid] = op


def _model_schemas(model: type[BaseModel], prefix: str) -> list[tuple[str, Schema]]:
    """The JSON schemas of ``model``'s nested models, then of ``model``, named ``prefix<Name>``."""
    schema = model.model_json_schema(ref_template=f"#/components/schemas/{prefix}{{model}}")
    named = [(f"{prefix}{name}", d) for name, d in schema.pop("$defs", {}).items()]
    return [*named, (f"{prefix}{model.__name__}", schema)]


def _key_description(spec: TopicSpec) -> str:
    return f"The partitioning key (toPositive(murmur2(key)) % {spec.partitions});" + (
        " the unit of per-key order." if spec.ordered else " order is not kept."
    )


def document(
    specs: Sequence[TopicSpec],
    *,
    kafka_bootstrap: str,
    redis_url: str,
    kafka_security_protocol: str = "PLAINTEXT",
    kafka_sasl_mechanism: str | None = None,
    avro: Mapping[str, Schema] | None = None,
    models: Mapping[str, type[BaseModel]] | None = None,
    groups: Mapping[str, str] | None = None,
    title: str = "pipeline events",
    version: str = "0.1.0",
) -> dict[str, Any]:
    """The AsyncAPI 3.0 document of ``specs`` (a JSON-ready dict).

    Args:
        specs: the topic declarations.
        kafka_bootstrap: the Kafka server (``host:port[,...]``).
        redis_url: the Redis server.
        kafka_security_protocol: librdkafka's ``security.protocol`` (``SSL`` and ``SASL_SSL``
            make the Kafka server ``kafka-secure``); see :func:`kafka_security`.
        kafka_sasl_mechanism: the SASL mechanism of a ``SASL_*`` protocol (``PLAIN``,
            ``SCRAM-SHA-256``, ...): the Kafka server's security scheme.
        avro: Avro records by subject (see :func:`avro_schemas`).
        models: the pydantic event model of each lane (see :func:`model_of`).
        groups: the consumer group of each lane (default: the lane's name).
        title: the document's title.
        version: the version of the described interface.

    Raises:
        ConfigError: a security protocol or SASL mechanism librdkafka does not know.
    """
    protocol, mechanism = kafka_security(
        {"security.protocol": kafka_security_protocol}
        | ({"sasl.mechanism": kafka_sasl_mechanism} if kafka_sasl_mechanism else {})
    )
    builder = _Builder(avro or {}, models or {})
    for spec in sorted(specs, key=lambda s: s.name):
        builder.lane(spec, (groups or {}).get(spec.lane, spec.lane))
    components: dict[str, Any] = {"schemas": builder.schemas, "messages": builder.messages}
    if mechanism is not None:
        components["securitySchemes"] = {KAFKA_SCHEME: _kafka_scheme(mechanism)}
    doc: dict[str, Any] = {
        "asyncapi": ASYNCAPI_VERSION,
        "info": {
            "title": title,
            "version": version,
            "description": (
                "Keyed events on Kafka or Redis Streams, from `topics/*.yaml`: each lane's main "
                "topic, retry tiers and dead-letter topic, with the headers the pipeline sets."
            ),
        },
        "defaultContentType": "application/json",
        "servers": {
            "kafka": _kafka_server(kafka_bootstrap, protocol, mechanism),
            "redis": _redis_server(redis_url),
        },
        "channels": builder.channels,
        "operations": builder.operations,
        "components": components,
    }
    tree: dict[str, Any] = _tree(doc)  # PyYAML writes no anchors; no part is another's
    return tree


def _tree(value: Any) -> Any:
    """``value`` copied so that no dict or list appears in it twice.

    The builder puts one payload object in each of a lane's messages, and the header schemas
    (module constants, :mod:`pipeline.topics.asyncapi_headers`) share their properties. Dumped
    as they were, PyYAML wrote an anchor for each (``&id026`` ... ``*id026``), numbered in
    document order: a lane added ahead renumbered those of every lane after it, so a diff of two
    documents showed lanes that had not changed. And editing one part of a document edited the
    others, and the constants every later document of the process is built from.
    """
    if isinstance(value, dict):
        return {key: _tree(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_tree(item) for item in value]
    return value
