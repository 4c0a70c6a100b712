"""Event serdes: Avro in the Confluent wire format through the registry, or JSON for development.

* :class:`AvroSerializer` writes ``0x00 | schema id | Avro body`` (fastavro
  ``schemaless_writer``). The id is found once, on first use, by registering the schema
  (``auto_register``, the default), by looking it up, or by taking the subject's latest version
  (``use_latest``); afterwards serializing needs no registry call.
* :class:`AvroDeserializer` reads that format: the writer schema is fetched by id once and cached;
  with a ``reader_schema`` data is resolved into it (Avro schema resolution), otherwise it is
  returned as written. A ``model`` turns the record into a pydantic model.
* :class:`JsonSerializer` writes plain UTF-8 JSON, no registry; the deserializer reads it too
  when ``allow_json`` is set (a JSON message starts with ``{``, never with the magic byte 0).

Values may be mappings or pydantic models whose fields match the record (see
:mod:`pipeline.registry.client.events`): ``datetime`` for ``timestamp-millis``, ``dict`` for maps,
``None`` for a ``null`` union branch. Both are wire-compatible with ``confluent_kafka``'s own
Avro serdes. Encoding failures raise :class:`~pipeline.registry.errors.SerdeError`.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from io import BytesIO
from typing import Any, TypeVar

from fastavro import schemaless_reader, schemaless_writer
from fastavro.read import SchemaResolutionError
from fastavro.validation import ValidationError as AvroValidationError
from fastavro.validation import validate
from pydantic import BaseModel, ValidationError

from pipeline.registry.canonical import ParsedSchema, parse, parse_json
from pipeline.registry.client.http import RegistryClient
from pipeline.registry.client.wire import HEADER_BYTES, header, schema_id_of
from pipeline.registry.errors import (
    InvalidSchema,
    RegistryError,
    RegistryUnreachable,
    SerdeError,
)

M = TypeVar("M", bound=BaseModel)


def _parsed(schema: str | Mapping[str, Any] | ParsedSchema) -> ParsedSchema:
    if isinstance(schema, ParsedSchema):
        return schema
    return parse(schema) if isinstance(schema, str) else parse_json(dict(schema))


def _record(value: Mapping[str, Any] | BaseModel) -> Any:
    return value.model_dump() if isinstance(value, BaseModel) else value


class AvroSerializer:
    """Serializes records with one schema under one subject; thread-safe."""

    def __init__(
        self,
        client: RegistryClient,
        schema: str | Mapping[str, Any] | ParsedSchema,
        subject: str,
        *,
        auto_register: bool = True,
        use_latest: bool = False,
    ) -> None:
        """Prepare; no registry call happens before the first :meth:`serialize`.

        Args:
            client: the registry.
            schema: the Avro schema the values follow.
            subject: the subject it belongs to, e.g. ``messages-value`` (topic naming) or the
                record's full name (record naming, as ``pipeline schemas push`` registers).
            auto_register: register the schema if needed; otherwise it must already be there.
            use_latest: write with the subject's latest version instead (the values must fit it).

        Raises:
            InvalidSchema: ``schema`` is not a valid Avro schema.
        """
        if use_latest and auto_register:
            raise ValueError("use_latest and auto_register exclude each other")
        self._client = client
        self._schema = _parsed(schema)
        self._subject = subject
        self._auto_register = auto_register
        self._use_latest = use_latest
        self._writer: Any = None
        self._header = b""
        self._lock = threading.Lock()

    @property
    def schema_id(self) -> int:
        """The id written in every message (resolved on first use)."""
        self._resolve()
        return int.from_bytes(self._header[1:], "big")

    def _resolve(self) -> None:
        with self._lock:
            if self._header:
                return
            if self._use_latest:
                latest = self._client.latest(self._subject)
                schema_id, writer = latest.schema_id, parse(latest.schema).parsed
            elif self._auto_register:
                schema_id = self._client.register(self._subject, self._schema.normalized)
                writer = self._schema.parsed
            else:
                schema_id = self._client.lookup(self._subject, self._schema.normalized).schema_id
                writer = self._schema.parsed
            self._writer = writer
            self._header = header(schema_id)

    def serialize(self, value: Mapping[str, Any] | BaseModel) -> bytes:
        """One framed Avro message.

        Raises:
            SerdeError: the value does not fit the schema.
            RegistryError: the schema could not be registered or found.
        """
        if not self._header:
            self._resolve()
        buf = BytesIO()
        buf.write(self._header)
        record = _record(value)
        try:
            # The writer alone would truncate 2.7 to 2 for an int, or write an int past 32 bits
            # that other Avro readers refuse: check the value first.
            validate(record, self._writer, raise_errors=True)
            schemaless_writer(buf, self._writer, record)
        except AvroValidationError as exc:
            problems = "; ".join(str(e)[:200] for e in exc.errors[:3])
            reason = f"value does not fit the schema of {self._subject}: {problems}"
            raise SerdeError(reason) from exc
        except (ValueError, TypeError, KeyError, AttributeError, OverflowError) as exc:
            raise SerdeError(f"value does not fit the schema of {self._subject}: {exc}") from exc
        return buf.getvalue()

    __call__ = serialize


class AvroDeserializer:
    """Deserializes framed Avro messages of any schema id; thread-safe."""

    def __init__(
        self,
        client: RegistryClient,
        *,
        reader_schema: str | Mapping[str, Any] | ParsedSchema | None = None,
        allow_json: bool = False,
    ) -> None:
        """Prepare; writer schemas are fetched on first sight of each id.

        Args:
            client: the registry.
            reader_schema: resolve every message into this schema (Avro schema resolution);
                None returns records as written.
            allow_json: accept plain JSON messages too (development).
        """
        self._client = client
        self._reader = _parsed(reader_schema) if reader_schema is not None else None
        self._allow_json = allow_json
        self._plans: dict[int, tuple[Any, Any]] = {}

    def _plan(self, schema_id: int) -> tuple[Any, Any]:
        plan = self._plans.get(schema_id)
        if plan is None:
            try:
                writer = parse(self._client.schema(schema_id))
            except RegistryUnreachable as exc:
                # Not a SerdeError: the message is fine and the next attempt may fetch it.
                raise RegistryError(f"schema {schema_id} not fetched: {exc}") from exc
            except InvalidSchema as exc:
                raise SerdeError(f"schema {schema_id} from the registry is invalid: {exc}") from exc
            reader = self._reader
            same = reader is None or reader.fingerprint == writer.fingerprint
            plan = (writer.parsed, None if same or reader is None else reader.parsed)
            self._plans[schema_id] = plan
        return plan

    def deserialize(self, data: bytes) -> Any:
        """The record in ``data`` (a dict), or the JSON value if ``allow_json``.

        Raises:
            SerdeError: not a framed message (nor JSON), the body does not match its schema, or
                the reader schema cannot read it.
            RegistryError: the writer schema could not be fetched (the registry is down, slow
                or does not know the id): not a SerdeError, so a consumer retries it.
        """
        if self._allow_json and data[:1] == b"{":
            try:
                return json.loads(data)
            except ValueError as exc:
                raise SerdeError(f"invalid JSON message: {exc}") from exc
        writer, reader = self._plan(schema_id_of(data))
        buf = BytesIO(data)
        buf.seek(HEADER_BYTES)
        try:
            return schemaless_reader(buf, writer, reader)
        except (
            ValueError,
            TypeError,
            KeyError,
            IndexError,
            EOFError,
            StopIteration,
            SchemaResolutionError,
        ) as exc:
            detail = str(exc) or "the body ends before the record does"  # a bare EOFError
            raise SerdeError(f"message does not match its schema: {detail}") from exc

    __call__ = deserialize

    def to_model(self, data: bytes, model: type[M]) -> M:
        """The record in ``data`` as ``model``.

        Raises:
            SerdeError: as :meth:`deserialize`, or the record does not validate as ``model``.
        """
        record = self.deserialize(data)
        try:
            return model.model_validate(record)
        except ValidationError as exc:
            raise SerdeError(f"record does not fit {model.__name__}: {exc}") from exc


class JsonSerializer:
    """Plain UTF-8 JSON, for development; no registry, no framing."""

    def serialize(self, value: Mapping[str, Any] | BaseModel) -> bytes:
        """``value`` as compact JSON (datetimes as ISO 8601)."""
        if isinstance(value, BaseModel):
            return value.model_dump_json().encode()
        try:
            return json.dumps(value, separators=(",", ":"), default=str).encode()
        except (TypeError, ValueError) as exc:
            raise SerdeError(f"value is not JSON-serializable: {exc}") from exc

    __call__ = serialize


__all__ = [
    "AvroDeserializer",
    "AvroSerializer",
    "JsonSerializer",
    "RegistryError",
    "SerdeError",
]
