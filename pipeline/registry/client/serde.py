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

A body is read only within bounds: fastavro builds every item an array block claims, and an item
of a type that takes no bytes (``null``, a record of no fields) costs nothing to send, so a few
bytes could claim 2^62 of them; and it recurses in C per nesting level, so a 10 kB body nesting
a recursive record 10 000 deep crashes the process. Bodies of writer schemas that allow either
are scanned first (:class:`_BodyScan`) and refused past :data:`MAX_EMPTY_ITEMS` items that take
no bytes, or past :data:`MAX_NESTING` levels.
"""

from __future__ import annotations

import contextlib
import copy
import json
import threading
import time
from collections.abc import Mapping
from io import BytesIO
from typing import Any, TypeVar

from fastavro import schemaless_reader, schemaless_writer
from fastavro.read import LOGICAL_READERS, SchemaResolutionError
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
    SchemaNotFound,
    SerdeError,
)

M = TypeVar("M", bound=BaseModel)

MAX_EMPTY_ITEMS = 65_536
"""Array items of types that take no bytes one message may hold (fastavro builds each one)."""
MAX_NESTING = 256
"""Levels (records, arrays, maps, unions) one message's value may nest (fastavro crashes past
~5000: it recurses in C)."""

_PROBLEMS_SAID = 3
"""Validation errors a reason spells out (a dead letter keeps 500 characters of it)."""
_VERSIONS_SAID = 3
"""Subject versions a reason names for the schema id a message was written with."""
_WRITTEN_KEPT_S = 300.0
"""How long a schema id's subject versions (or the failure to get them) are kept for reasons."""
_INPUT_CHARS = 60
_ENUM_ERRORS = frozenset({"enum", "literal_error"})

_FIXED_BYTES = {"boolean": 1, "float": 4, "double": 8}
_VARINTS = frozenset({"int", "long", "enum"})
_LONG_MAX_SHIFT = 63
_VARINT_MORE = 0x80
_DEFINED = frozenset({"record", "error", "enum", "fixed", "array", "map"})


class _Malformed(Exception):
    """The body does not follow its schema (fastavro will say how)."""


def _named(tree: Any, names: dict[str, Any]) -> dict[str, Any]:
    """Every named type in ``tree`` (normalised: full names, each defined once) by full name."""
    if isinstance(tree, list):
        for branch in tree:
            _named(branch, names)
    elif isinstance(tree, dict):
        if tree.get("type") in ("record", "error", "enum", "fixed") and "name" in tree:
            names[tree["name"]] = tree
        for part in ("fields", "items", "values"):
            inner = tree.get(part)
            if isinstance(inner, list) and part == "fields":
                for f in inner:
                    _named(f["type"], names)
            elif inner is not None:
                _named(inner, names)
        if isinstance(tree.get("type"), dict | list):
            _named(tree["type"], names)
    return names


class _BodyScan:
    """What a writer schema allows that needs bounds, and the check of one body against them."""

    def __init__(self, tree: Any) -> None:
        self._names = _named(tree, {})
        self._tree = tree
        self._empty: dict[int, bool] = {}

    def resolve(self, schema: Any) -> Any:
        """``schema`` with named references and wrapped types (``{"type": "long", ...}``) undone."""
        while True:
            if isinstance(schema, str) and schema in self._names:
                schema = self._names[schema]
            elif isinstance(schema, dict) and schema["type"] not in _DEFINED:
                schema = schema["type"]
            else:
                return schema

    def takes_no_bytes(self, schema: Any, seen: frozenset[str] = frozenset()) -> bool:
        """Whether every value of ``schema`` encodes to zero bytes (null, records of such)."""
        schema = self.resolve(schema)
        if schema == "null":
            return True
        if not isinstance(schema, dict):
            return False
        if schema["type"] == "fixed":
            return bool(schema["size"] == 0)
        if schema["type"] not in ("record", "error") or schema["name"] in seen:
            return False  # a record holding itself outside a union has no finite value
        key = id(schema)
        if key not in self._empty:
            inner = seen | {schema["name"]}
            self._empty[key] = all(self.takes_no_bytes(f["type"], inner) for f in schema["fields"])
        return self._empty[key]

    def needed(self) -> bool:
        """Whether the schema allows an unbounded value: items that take no bytes, or recursion."""

        def walk(schema: Any, stack: frozenset[str]) -> bool:
            if isinstance(schema, list):
                return any(walk(branch, stack) for branch in schema)
            if isinstance(schema, str):
                return schema in stack
            kind = schema["type"]
            if kind not in _DEFINED:
                return walk(kind, stack)
            if kind in ("record", "error"):
                inner = stack | {schema["name"]}
                return any(walk(f["type"], inner) for f in schema["fields"])
            if kind == "array":
                return self.takes_no_bytes(schema["items"]) or walk(schema["items"], stack)
            return kind == "map" and walk(schema["values"], stack)

        return walk(self._tree, frozenset())

    def check(self, body: bytes, start: int) -> None:
        """Refuse ``body[start:]`` if its value is past the bounds, without building it.

        Raises:
            SerdeError: past MAX_EMPTY_ITEMS items that take no bytes, or MAX_NESTING levels.
            _Malformed: the body does not follow the schema.
        """
        _Walk(self, body, start).value(self._tree, 0)


class _Walk:
    """One body's walk (a deserializer is shared between threads: the position lives here)."""

    def __init__(self, scan: _BodyScan, body: bytes, start: int) -> None:
        self._scan = scan
        self._body = body
        self._pos = start
        self._empty_items = 0

    def _long(self) -> int:
        shift = result = 0
        while True:
            if self._pos >= len(self._body) or shift > _LONG_MAX_SHIFT:
                raise _Malformed
            byte = self._body[self._pos]
            self._pos += 1
            result |= (byte & 0x7F) << shift
            if byte < _VARINT_MORE:
                return (result >> 1) ^ -(result & 1)
            shift += 7

    def _skip(self, n_bytes: int) -> None:
        if n_bytes < 0 or self._pos + n_bytes > len(self._body):
            raise _Malformed
        self._pos += n_bytes

    def value(self, schema: Any, depth: int) -> None:
        """Skip one value of ``schema``, nested ``depth`` levels down."""
        schema = self._scan.resolve(schema)
        if isinstance(schema, list | dict):
            self._nested(schema, depth)
        elif schema in _VARINTS:
            self._long()
        elif schema in _FIXED_BYTES:
            self._skip(_FIXED_BYTES[schema])
        elif schema in ("string", "bytes"):
            self._skip(self._long())

    def _nested(self, schema: list[Any] | dict[str, Any], depth: int) -> None:
        if isinstance(schema, dict) and schema["type"] == "enum":
            self._long()
            return
        if isinstance(schema, dict) and schema["type"] == "fixed":
            self._skip(schema["size"])
            return
        if depth >= MAX_NESTING:
            raise SerdeError(f"message nests deeper than {MAX_NESTING} levels; refused unread")
        if isinstance(schema, list):  # a union: the branch's index, then its value
            index = self._long()
            if not 0 <= index < len(schema):
                raise _Malformed
            self.value(schema[index], depth + 1)
        elif schema["type"] in ("record", "error"):
            for f in schema["fields"]:
                self.value(f["type"], depth + 1)
        else:
            self._blocks(schema, depth + 1)

    def _blocks(self, schema: dict[str, Any], depth: int) -> None:
        is_map = schema["type"] == "map"
        items = schema["values"] if is_map else schema["items"]
        empty = not is_map and self._scan.takes_no_bytes(items)
        while count := self._long():
            if count < 0:
                count = -count
                self._long()  # the block's size in bytes
            if empty:
                self._empty_items += count
                if self._empty_items > MAX_EMPTY_ITEMS:
                    raise SerdeError(
                        f"message claims over {MAX_EMPTY_ITEMS} array items that take no bytes "
                        "(null, records of no fields); refused unread"
                    )
                continue
            for _ in range(count):  # each item takes a byte at least: bounded by the body
                if is_map:
                    self._skip(self._long())
                self.value(items, depth)


_JSON_KIND: dict[str, type | tuple[type, ...]] = {
    "null": type(None),
    "boolean": bool,
    "int": int,
    "long": int,
    "float": (int, float),
    "double": (int, float),
    "string": str,
    "bytes": str,
    "fixed": str,
    "enum": str,
    "array": list,
    "map": dict,
    "record": dict,
    "error": dict,
}


def _union_branch(union: list[Any], value: Any, names: Mapping[str, Any]) -> Any:
    """The first branch of ``union`` whose JSON form ``value`` is (None if none is)."""
    for branch in union:
        resolved = names.get(branch, branch) if isinstance(branch, str) else branch
        kind = resolved if isinstance(resolved, str) else resolved.get("type")
        fits = isinstance(value, _JSON_KIND.get(kind, ()))
        if fits and (kind == "boolean" or not isinstance(value, bool)):
            return resolved
    return None


def _default_value(schema: Any, value: Any, names: Mapping[str, Any]) -> Any:
    """A default as the schema's JSON gives it, as the value a reader returns for it.

    Avro writes a ``bytes`` or ``fixed`` default as a string whose code points 0-255 are the
    bytes, and a logical type's default as its underlying value; fastavro fills defaults in as
    they stand, so a reader got a str for bytes and an int for a timestamp, and the writer
    refused a value that left such a field out.
    """
    if isinstance(schema, str):
        schema = names.get(schema, schema)
    if isinstance(schema, list):
        branch = _union_branch(schema, value, names)
        return value if branch is None else _default_value(branch, value, names)
    kind = schema if isinstance(schema, str) else schema["type"]
    if isinstance(kind, dict | list):
        return _default_value(kind, value, names)
    if kind in ("bytes", "fixed") and isinstance(value, str):
        try:
            value = value.encode("latin-1")
        except UnicodeEncodeError:
            return value
    elif kind in ("record", "error") and isinstance(value, dict):
        value = {
            f["name"]: _default_value(f["type"], value.get(f["name"], f.get("default")), names)
            for f in schema["fields"]
            if f["name"] in value or "default" in f
        }
    elif kind == "array" and isinstance(value, list):
        value = [_default_value(schema["items"], item, names) for item in value]
    elif kind == "map" and isinstance(value, dict):
        value = {k: _default_value(schema["values"], v, names) for k, v in value.items()}
    logical = schema.get("logicalType") if isinstance(schema, dict) else None
    convert = LOGICAL_READERS.get(f"{kind}-{logical}")
    # The registry checked the default's type: a value the conversion refuses is left as is.
    with contextlib.suppress(ValueError, TypeError, OverflowError):
        value = value if convert is None else convert(value, schema, schema)
    return value


def _with_defaults_decoded(parsed: Any) -> Any:
    """A copy of a fastavro parsed schema whose field defaults are the values they stand for."""
    parsed = copy.deepcopy(parsed)
    names = parsed.get("__named_schemas", {}) if isinstance(parsed, dict) else {}
    seen: set[int] = set()
    pending = [parsed, *names.values()]
    while pending:
        schema = pending.pop()
        if isinstance(schema, list):
            pending.extend(schema)
        if not isinstance(schema, dict) or id(schema) in seen:
            continue
        seen.add(id(schema))
        pending.extend(
            schema[part]
            for part in ("items", "values", "type")
            if isinstance(schema.get(part), dict | list)
        )
        for f in schema.get("fields", ()) if schema.get("type") in ("record", "error") else ():
            pending.append(f["type"])
            if "default" in f:
                f["default"] = _default_value(f["type"], f["default"], names)
    return parsed


def _parsed(schema: str | Mapping[str, Any] | ParsedSchema) -> ParsedSchema:
    if isinstance(schema, ParsedSchema):
        return schema
    # Read from the registry or the application's own: no step bound, as the server's reads.
    if isinstance(schema, str):
        return parse(schema, bounded=False)
    return parse_json(dict(schema), bounded=False)


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
            try:
                if self._use_latest:
                    latest = self._client.latest(self._subject)
                    schema_id, writer = latest.schema_id, parse(latest.schema, bounded=False).parsed
                elif self._auto_register:
                    schema_id = self._client.register(self._subject, self._schema.normalized)
                    writer = self._schema.parsed
                else:
                    found = self._client.lookup(self._subject, self._schema.normalized)
                    schema_id, writer = found.schema_id, self._schema.parsed
            except RegistryUnreachable as exc:
                # Not a SerdeError: the value is fine and the next attempt may resolve the id.
                raise RegistryError(str(exc)) from exc
            self._writer = _with_defaults_decoded(writer)
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
            reason = f"value does not fit the schema of {self._subject}: {_avro_problems(exc)}"
            raise SerdeError(reason) from exc
        except RecursionError:  # a recursive schema's value nested past the checker
            reason = f"value does not fit the schema of {self._subject}: nested too deep to check"
            raise SerdeError(reason) from None
        except (ValueError, TypeError, KeyError, AttributeError, OverflowError) as exc:
            raise SerdeError(f"value does not fit the schema of {self._subject}: {exc}") from exc
        return buf.getvalue()

    __call__ = serialize


def _avro_problems(exc: AvroValidationError) -> str:
    """The first three of a validation's problems, each cut to 200 characters.

    A problem's text holds the value that failed, which may nest too deep to print.
    """
    try:
        return "; ".join(str(e)[:200] for e in exc.errors[:3])
    except RecursionError:
        return "nested too deep to describe"


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
        self._reader_parsed = (
            _with_defaults_decoded(self._reader.parsed) if self._reader is not None else None
        )
        self._allow_json = allow_json
        self._plans: dict[int, tuple[Any, Any, _BodyScan | None]] = {}
        self._written: dict[int, tuple[str, float]] = {}
        """Per schema id, how a reason names it and until when (monotonic s)."""

    def _plan(self, schema_id: int) -> tuple[Any, Any, _BodyScan | None]:
        plan = self._plans.get(schema_id)
        if plan is None:
            try:
                writer = parse(self._client.schema(schema_id), bounded=False)
            except RegistryUnreachable as exc:
                # Not a SerdeError: the message is fine and the next attempt may fetch it.
                raise RegistryError(f"schema {schema_id} not fetched: {exc}") from exc
            except SchemaNotFound as exc:
                # Retried too (a replica may be catching up), so this is what the dead letter
                # says once the tiers are spent: where it asked, and what to do about it.
                raise SchemaNotFound(
                    f"schema id {schema_id} is not in the registry at {self._client.url}: the "
                    "message was produced against another registry, or its schema was "
                    "hard-deleted; redrive it once the schema is registered there"
                ) from exc
            except InvalidSchema as exc:
                raise SerdeError(f"schema {schema_id} from the registry is invalid: {exc}") from exc
            reader = self._reader
            same = reader is None or reader.fingerprint == writer.fingerprint
            scan = _BodyScan(writer.tree)
            plan = (
                writer.parsed,
                None if same or reader is None else self._reader_parsed,
                scan if scan.needed() else None,
            )
            self._plans[schema_id] = plan
        return plan

    def _written_with(self, schema_id: int) -> str:
        """``schema id 3 (pings-value version 2)``: how a reason names a message's schema.

        Looked up once per id for :data:`_WRITTEN_KEPT_S` (a failed lookup too: it is only the
        wording of a reason, and a registry that does not answer is not asked again for every
        message that does not fit, each call blocking for its timeout).
        """
        now = time.monotonic()
        kept = self._written.get(schema_id)
        if kept is not None and kept[1] > now:
            return kept[0]
        named = f"schema id {schema_id}"
        try:
            versions = self._client.subject_versions(schema_id)
        except RegistryError:  # only the reason is at stake: it names the id alone
            versions = []
        said = [f"{subject} version {version}" for subject, version in versions[:_VERSIONS_SAID]]
        if len(versions) > _VERSIONS_SAID:
            said.append(f"{len(versions) - _VERSIONS_SAID} more")
        if said:
            named += f" ({', '.join(said)})"
        self._written[schema_id] = (named, now + _WRITTEN_KEPT_S)
        return named

    def deserialize(self, data: bytes) -> Any:
        """The record in ``data`` (a dict), or the JSON value if ``allow_json``.

        Raises:
            SerdeError: not a framed message (nor JSON), the body does not match its schema, or
                the reader schema cannot read it.
            RegistryError: the writer schema could not be fetched (the registry is down, slow
                or does not know the id: :class:`SchemaNotFound`, naming the registry): not a
                SerdeError, so a consumer retries it.
        """
        if self._allow_json and data[:1] == b"{":
            try:
                return json.loads(data)
            except (ValueError, RecursionError) as exc:  # RecursionError: nested too deep
                raise SerdeError(f"invalid JSON message: {exc}") from exc
        schema_id = schema_id_of(data)
        writer, reader, scan = self._plan(schema_id)
        buf = BytesIO(data)
        buf.seek(HEADER_BYTES)
        try:
            if scan is not None:
                scan.check(data, HEADER_BYTES)
            return schemaless_reader(buf, writer, reader)
        except _Malformed:
            raise SerdeError("message does not match its schema: its body is malformed") from None
        except SchemaResolutionError as exc:  # e.g. a symbol the reader's enum lacks, no default
            written = self._written_with(schema_id)
            raise SerdeError(f"message written with {written} does not resolve: {exc}") from exc
        except (
            ValueError,
            TypeError,
            KeyError,
            IndexError,
            EOFError,
            StopIteration,
        ) as exc:
            detail = str(exc) or "the body ends before the record does"  # a bare EOFError
            raise SerdeError(f"message does not match its schema: {detail}") from exc

    __call__ = deserialize

    def to_model(self, data: bytes, model: type[M]) -> M:
        """The record in ``data`` as ``model``.

        The model is the reader: as in Avro schema resolution, fields of the writer's record
        that a model forbidding extras lacks (a newer schema's additions) are skipped, and an
        enum symbol the model's enum lacks is its default if it has one (an ``enum.Enum``
        whose ``_missing_`` returns a member), else an error.

        Raises:
            SerdeError: as :meth:`deserialize`, or the record does not validate as ``model``
                (the reason names the schema id and its subject versions).
        """
        record = self.deserialize(data)
        framed = data[:1] != b"{"
        if framed and isinstance(record, dict):
            record = _reader_fields(record, model)
        try:
            return model.model_validate(record)
        except ValidationError as exc:
            written = f"written with {self._written_with(schema_id_of(data))} " if framed else ""
            reason = f"record {written}does not fit {model.__name__}: {_problems(exc)}"
            raise SerdeError(reason) from exc


def _problems(exc: ValidationError) -> str:
    """The first few of ``exc``'s errors on one line, a symbol the model's enum lacks said so."""
    errors = exc.errors(include_url=False)
    said: list[str] = []
    for error in errors[:_PROBLEMS_SAID]:
        where = ".".join(str(part) for part in error["loc"]) or "the record"
        given = error.get("input")
        if error["type"] in _ENUM_ERRORS and isinstance(given, str):
            expected = error.get("ctx", {}).get("expected", "")
            said.append(
                f"{where}: symbol {given!r} is not in the model's enum ({expected}), which has "
                "no default for symbols it lacks (an enum.Enum's _missing_ gives one)"
            )
        elif error["type"] == "missing":
            said.append(f"{where}: {error['msg']}")
        else:
            shown = repr(given)
            if len(shown) > _INPUT_CHARS:
                shown = shown[: _INPUT_CHARS - 3] + "..."
            said.append(f"{where}: {error['msg']} (got {shown})")
    if len(errors) > len(said):
        said.append(f"{len(errors) - len(said)} more")
    return "; ".join(said)


def _reader_fields(record: dict[str, Any], model: type[BaseModel]) -> dict[str, Any]:
    """``record`` without the fields ``model`` lacks, if it forbids extras (else as it is)."""
    if model.model_config.get("extra") != "forbid":
        return record
    known = set(model.model_fields)
    for info in model.model_fields.values():
        known.update(a for a in (info.alias, info.validation_alias) if isinstance(a, str))
    return {name: value for name, value in record.items() if name in known}


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
