"""Typed events as pydantic models, each matching one ``schemas/*.avsc`` record.

A model maps to its Avro record field by field: ``str`` <-> ``string``, ``int`` <-> ``int`` /
``long``, ``float`` <-> ``float`` / ``double``, ``bool`` <-> ``boolean``, ``bytes`` <->
``bytes``, ``datetime`` <-> ``long`` with ``timestamp-millis`` (fastavro converts; timezone-aware,
UTC), ``dict[str, T]`` <-> ``map``, ``list[T]`` <-> ``array``, ``T | None`` <-> a union with
``null``. :func:`model_mismatches` checks a model against a schema (a test keeps every model here
true to its file); :class:`~pipeline.registry.client.serde.AvroSerializer` accepts model
instances and :meth:`~pipeline.registry.client.serde.AvroDeserializer.to_model` returns them.
"""

from __future__ import annotations

import types
from datetime import datetime
from typing import Any, Union, get_args, get_origin

from pydantic import AwareDatetime, BaseModel, ConfigDict

from pipeline.registry.canonical import ParsedSchema

_PLAIN: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "int": (int,),
    "long": (int,),
    "float": (float,),
    "double": (float,),
    "boolean": (bool,),
    "bytes": (bytes,),
}


class MessageReceivedRecord(BaseModel):
    """An inbound webhook message (``schemas/message_received.avsc``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    event_id: str
    tenant: str
    source: str
    conversation_id: str
    text: str
    received_at: AwareDatetime
    headers: dict[str, str] | None = None


SCHEMA_FILES: dict[type[BaseModel], str] = {MessageReceivedRecord: "message_received.avsc"}
"""Each model and the file (under ``schemas/``) holding its Avro schema."""


def _unwrap_optional(annotation: Any) -> tuple[Any, bool]:
    if get_origin(annotation) in {Union, types.UnionType}:
        args = [a for a in get_args(annotation) if a is not type(None)]
        if len(args) == 1 and len(get_args(annotation)) == 2:  # noqa: PLR2004 - T | None
            return args[0], True
    return annotation, False


def _fits(annotation: Any, avro: Any) -> bool:
    if isinstance(avro, list):
        branches = [b for b in avro if b != "null"]
        inner, optional = _unwrap_optional(annotation)
        return optional == ("null" in avro) and len(branches) == 1 and _fits(inner, branches[0])
    if isinstance(avro, dict):
        kind = avro["type"]
        if avro.get("logicalType") in {"timestamp-millis", "timestamp-micros"}:
            return annotation in {datetime, AwareDatetime}
        origin, args = get_origin(annotation), get_args(annotation)
        if kind == "map":
            return origin is dict and args[0] is str and _fits(args[1], avro["values"])
        if kind == "array":
            return origin is list and _fits(args[0], avro["items"])
        return _fits(annotation, kind) if kind in _PLAIN else False
    return annotation in _PLAIN.get(avro, ())


def model_mismatches(model: type[BaseModel], schema: ParsedSchema) -> list[str]:
    """How ``model`` differs from the record ``schema``; empty when they match field for field."""
    tree = schema.tree
    if not isinstance(tree, dict) or tree.get("type") != "record":
        return ["the schema is not a record"]
    problems: list[str] = []
    avro_fields = {f["name"]: f for f in tree["fields"]}
    for name, info in model.model_fields.items():
        spec = avro_fields.pop(name, None)
        if spec is None:
            problems.append(f"model field {name!r} is not in the schema")
        elif not _fits(info.annotation, spec["type"]):
            problems.append(f"field {name!r}: {info.annotation} does not map to {spec['type']}")
        elif info.is_required() == ("default" in spec):
            problems.append(f"field {name!r}: a default in one but not the other")
    problems.extend(f"schema field {name!r} is not in the model" for name in avro_fields)
    return problems
