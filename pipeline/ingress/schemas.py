"""Validation at the door: a lane may require its webhook payloads to match a registered schema.

A lane declared with ``schema: <subject>`` in ``topics/*.yaml`` has every accepted payload
checked, as JSON, against the subject's latest Avro schema in the registry (fastavro's
validator: every field present or defaulted, of the right type; extra JSON members are allowed).
A payload that does not match is answered 400 with the field at fault, and nothing is stored.

Schemas are fetched when the ingress starts and refreshed every ``refresh_s`` off the request
path. While a subject's schema is unknown (the registry is down, or the subject is not
registered yet) its lane is not validated: losing webhooks is worse than admitting one that a
consumer will dead-letter; each such start and refresh failure is logged.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Mapping
from typing import Any

from fastavro import parse_schema
from fastavro.schema import SchemaParseException
from fastavro.validation import ValidationError, validate

from pipeline.ingress.errors import SchemaMismatch
from pipeline.registry.client.http import RegistryClient
from pipeline.registry.errors import RegistryError

log = logging.getLogger(__name__)


def _as_string(schema: Any, binary: frozenset[str]) -> Any:
    """``schema`` (fastavro's parsed form) with ``bytes`` and ``fixed`` types read as strings."""
    if isinstance(schema, str):
        return "string" if schema == "bytes" or schema in binary else schema
    if isinstance(schema, list):
        return [_as_string(branch, binary) for branch in schema]
    kind = schema["type"]
    if kind in ("bytes", "fixed") or schema.get("name") in binary:
        return "string"
    if kind in ("record", "error"):
        fields = [{**f, "type": _as_string(f["type"], binary)} for f in schema["fields"]]
        return {**schema, "fields": fields}
    if kind in ("array", "map"):
        part = "items" if kind == "array" else "values"
        return {**schema, part: _as_string(schema[part], binary)}
    return (
        schema
        if not isinstance(kind, dict | list)
        else {**schema, "type": _as_string(kind, binary)}
    )


def _json_form(parsed: Any) -> Any:
    """The schema a JSON payload is checked against: Avro's JSON encoding of ``parsed``.

    JSON has no bytes: Avro writes ``bytes`` and ``fixed`` values (and their defaults) as
    strings, so fastavro's validator, which wants Python bytes there, refused every payload of
    a subject with such a field, even one that left a defaulted field out.
    """
    if not isinstance(parsed, dict):
        return parse_schema(_as_string(parsed, frozenset()))
    named = parsed.get("__named_schemas", {})
    binary = frozenset(name for name, t in named.items() if t.get("type") == "fixed")
    tree = {k: v for k, v in parsed.items() if not k.startswith("__")}
    return parse_schema(_as_string(tree, binary))


class LaneSchemas:
    """The latest registered schema of each validated lane, checked against payloads."""

    def __init__(
        self, client: RegistryClient, subjects: Mapping[str, str], *, refresh_s: float = 60.0
    ) -> None:
        """Validate the lanes of ``subjects`` (lane -> subject) with ``client``'s schemas."""
        self._client = client
        self._subjects = dict(subjects)
        self._refresh_s = refresh_s
        self._schemas: dict[str, Any] = {}
        self._task: asyncio.Task[None] | None = None

    async def refresh(self) -> None:
        """Fetch every subject's latest schema (in a thread: the client is synchronous)."""
        for lane, subject in self._subjects.items():
            try:
                latest = await asyncio.to_thread(self._client.latest, subject)
                self._schemas[lane] = _json_form(parse_schema(json.loads(latest.schema)))
            except (RegistryError, ValueError, OSError, SchemaParseException) as exc:
                # SchemaParseException: a registry that accepts what fastavro refuses (an
                # invalid default: Confluent's does) must not stop the start or the refreshes.
                log.warning(
                    "schema %s of lane %s not loaded (not validated): %s", subject, lane, exc
                )

    async def start(self) -> None:
        """Load the schemas, then keep them fresh in the background."""
        if not self._subjects:
            return
        await self.refresh()
        self._task = asyncio.create_task(self._refresh_forever())

    async def close(self) -> None:
        """Stop refreshing."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _refresh_forever(self) -> None:
        while True:
            await asyncio.sleep(self._refresh_s)
            await self.refresh()

    def check(self, lane: str, body: bytes) -> None:
        """Raise :class:`SchemaMismatch` if ``body`` does not match ``lane``'s schema."""
        schema = self._schemas.get(lane)
        if schema is None:
            return
        try:
            validate(json.loads(body), schema, raise_errors=True)
        except ValidationError as exc:
            fields = "; ".join(str(e) for e in exc.errors[:3])
            subject = self._subjects[lane]
            raise SchemaMismatch(f"does not match schema {subject}: {fields}") from exc
        except RecursionError:
            raise SchemaMismatch("not JSON: nested too deeply") from None
        except ValueError as exc:
            raise SchemaMismatch(f"not JSON: {exc}") from exc
