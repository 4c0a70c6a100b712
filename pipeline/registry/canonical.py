"""Avro schema parsing, normalisation and fingerprints.

A schema string becomes a :class:`ParsedSchema` with two derived texts:

* ``normalized``: the identity of a schema in the registry. Whitespace, attribute order and
  namespaces are normalised away (every name is written in full, ``namespace`` is dropped,
  ``{"type": "int"}`` becomes ``"int"``), but everything that changes meaning or intent is kept:
  defaults, aliases, docs, ``order``, logical types and custom properties. Two schema strings
  with the same normalised form get the same id; its SHA-256 is the store's unique
  ``fingerprint``.
* ``canonical``: the Avro *Parsing Canonical Form* (the specification's "Transforming into
  Parsing Canonical Form"), which drops docs, defaults and aliases too. Its CRC-64-AVRO
  fingerprint (``rabin_fingerprint``) is the one Avro single-object encoding uses.

Parsing validates with fastavro (types, default values) plus the checks fastavro leaves out:
name syntax, duplicate field names, duplicate or nested union branches, missing ``fields``,
a field's ``order`` and ``aliases``, a ``type`` attribute that is no type name, and a field
default checked all the way down (every record field, array item and map value), as Avro's
Java parser checks it.
Every failure raises :class:`~pipeline.registry.errors.InvalidSchema` naming the reason.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fastavro.schema import fingerprint, parse_schema, to_parsing_canonical_form

from pipeline.registry.errors import InvalidSchema

PRIMITIVES = frozenset({"null", "boolean", "int", "long", "float", "double", "bytes", "string"})
NAMED = frozenset({"record", "error", "enum", "fixed"})
_CONTAINERS = {"array": "items", "map": "values"}
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_ORDERS = ("ascending", "descending", "ignore")
"""A field's sort orders; Avro's Java parser fails on any other ``order``."""
_SURROGATE = re.compile(r"[\ud800-\udfff]")
# Attributes with a fixed place at the front of a normalised object; the rest follow sorted.
_LEADING = ("name", "type", "fields", "symbols", "items", "values", "size")
_HANDLED = frozenset({*_LEADING, "namespace", "aliases"})
MAX_NUMBER_DIGITS = 1000
"""Longest integer literal read (Jackson's default limit); Python's own is 4300 digits."""
MAX_DEPTH = 64
"""Deepest nesting of types (a record's field, an array's items, a map's values, a union's
branch each go one level down). Parsing, fastavro and the compatibility checker recurse per
level, so a cap far below Python's recursion limit keeps every later check on a subject from
failing; real schemas stay far below it."""
MAX_JSON_DEPTH = 512
"""Deepest nesting of JSON arrays and objects anywhere in a schema (defaults and custom
properties included). Above four times :data:`MAX_DEPTH`, so the type cap speaks first, and
far enough below the recursion limit that a stored schema always parses again, from however
deep in a request's stack."""
MAX_DEFAULT_STEPS = 1_000_000
"""Most comparisons of a default value with a type, over all defaults of one schema (about a
second). Linear defaults take one per value and branch tried; a union of thousands of records
against an array default of thousands of objects takes their product, and is refused past
this bound instead of holding a worker for minutes."""


@dataclass(frozen=True, slots=True)
class ParsedSchema:
    """A valid Avro schema with its normalised and canonical forms.

    Attributes:
        normalized: the normalised JSON text (the registry's identity of the schema).
        canonical: the Avro Parsing Canonical Form.
        fingerprint: SHA-256 hex of ``normalized``; unique per stored schema.
        rabin_fingerprint: CRC-64-AVRO hex of ``canonical``.
        tree: ``normalized`` as JSON values (full names everywhere), used by the compat checker.
        parsed: the fastavro parsed schema, ready for ``schemaless_writer``/``reader``.
    """

    normalized: str
    canonical: str
    fingerprint: str
    rabin_fingerprint: str
    tree: Any = field(repr=False, compare=False)
    parsed: Any = field(repr=False, compare=False)


def read_json(text: str | bytes, what: str = "Invalid schema") -> Any:
    """JSON text as values, refusing what a strict JSON reader (Confluent's) refuses.

    Python's ``json`` reads ``NaN`` and ``Infinity``, turns ``1e400`` into infinity, and raises
    RecursionError on deep nesting and ValueError past its integer digit limit: each of these
    is an InvalidSchema here, whose message starts with ``what``.

    Raises:
        InvalidSchema: not JSON, or JSON with a value no JSON number or Avro schema may hold.
    """
    try:
        return json.loads(
            text, parse_constant=_no_constant, parse_float=_finite, parse_int=_bounded_int
        )
    except RecursionError:
        msg = f"{what}: not valid JSON: nests deeper than {MAX_JSON_DEPTH} levels"
        raise InvalidSchema(msg) from None
    except (ValueError, TypeError) as exc:  # JSONDecodeError and UnicodeDecodeError included
        raise InvalidSchema(f"{what}: not valid JSON: {exc}") from None


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not a JSON number")


def _finite(text: str) -> float:
    number = float(text)
    if math.isinf(number):
        raise ValueError(f"{text[:40]} is out of the range of a double")
    return number


def _bounded_int(text: str) -> int:
    if len(text) > MAX_NUMBER_DIGITS:
        raise ValueError(f"a number has more than {MAX_NUMBER_DIGITS} digits")
    return int(text)


class DefaultsTooCostly(InvalidSchema):
    """A schema's defaults take more than :data:`MAX_DEFAULT_STEPS` comparisons to check.

    Attributes:
        fingerprint: the schema's fingerprint, so that a registry can tell a schema it already
            holds (stored by a release without the bound) from a new one.
    """

    def __init__(self, message: str, fingerprint: str) -> None:
        """Refuse with ``message``; ``fingerprint`` is :attr:`ParsedSchema.fingerprint`'s."""
        super().__init__(message)
        self.fingerprint = fingerprint


def parse(schema_text: str, *, bounded: bool = True) -> ParsedSchema:
    """Parse, validate and normalise one Avro schema given as JSON text.

    ``bounded`` refuses defaults past :data:`MAX_DEFAULT_STEPS` comparisons, as the registry
    refuses what a client sends; False for a schema read back from a store or a registry (a
    release without the bound may have stored it) or an application's own schema.

    Raises:
        InvalidSchema: the text is not JSON, or not a valid Avro schema; the message says why.
        DefaultsTooCostly: ``bounded``, and the defaults take too many steps to check.
    """
    return parse_json(read_json(schema_text), bounded=bounded)


def parse_json(raw: Any, *, bounded: bool = True) -> ParsedSchema:
    """Like :func:`parse` for a schema already decoded from JSON."""
    _check_values(raw)
    try:
        tree = _Normalizer().node(raw, "", "$")
        parsed = parse_schema(tree)
        _check_defaults(tree, bounded)
        # From the tree, not from ``parsed``: fastavro re-parses a parsed union branch by branch,
        # copying every named type into each (quadratic: 12 000 branches took 13 s).
        canonical = to_parsing_canonical_form(tree)
        rabin = fingerprint(canonical, "CRC-64-AVRO")
    except InvalidSchema:
        raise
    except _TooCostly as exc:  # the tree is whole: its fingerprint names the schema
        raise DefaultsTooCostly(str(exc), _fingerprint(_normalized(tree))) from None
    except Exception as exc:  # fastavro raises SchemaParseException, KeyError, TypeError, ...
        reason = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
        kind = "missing attribute" if isinstance(exc, KeyError) else type(exc).__name__
        raise InvalidSchema(f"Invalid schema: {kind}: {reason}") from None
    normalized = _normalized(tree)
    return ParsedSchema(
        normalized=normalized,
        canonical=canonical,
        fingerprint=_fingerprint(normalized),
        rabin_fingerprint=rabin,
        tree=tree,
        parsed=parsed,
    )


def _normalized(tree: Any) -> str:
    try:
        return json.dumps(tree, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except ValueError:  # a float NaN or infinity given as a value (JSON text never gets here)
        raise InvalidSchema("Invalid schema: NaN and Infinity are not JSON numbers") from None


def _fingerprint(normalized: str) -> str:
    return hashlib.sha256(normalized.encode()).hexdigest()


def _check_values(raw: Any) -> None:
    """Refuse JSON nested past :data:`MAX_JSON_DEPTH` and strings no store can keep.

    Iterative, so no depth exhausts the stack. A lone surrogate is not UTF-8; PostgreSQL text
    cannot hold NUL, which SQLite would keep, so the two stores would disagree.
    """
    pending: list[tuple[Any, int]] = [(raw, 1)]
    while pending:
        value, depth = pending.pop()
        if isinstance(value, dict | list) and depth > MAX_JSON_DEPTH:
            raise InvalidSchema(f"Invalid schema: JSON nests deeper than {MAX_JSON_DEPTH} levels")
        if isinstance(value, dict):
            pending.extend((key, depth) for key in value)
            pending.extend((item, depth + 1) for item in value.values())
        elif isinstance(value, list):
            pending.extend((item, depth + 1) for item in value)
        elif isinstance(value, str):
            if "\x00" in value:
                raise InvalidSchema("Invalid schema: a string holds the NUL character (U+0000)")
            if _SURROGATE.search(value):
                raise InvalidSchema("Invalid schema: a string holds a lone surrogate (U+D800-DFFF)")


def _is_int(bound: int) -> Callable[[Any], bool]:
    return lambda v: isinstance(v, int) and not isinstance(v, bool) and -bound <= v < bound


_SCALAR_DEFAULTS: dict[str, Callable[[Any], bool]] = {
    "null": lambda v: v is None,
    "boolean": lambda v: isinstance(v, bool),
    "int": _is_int(2**31),
    "long": _is_int(2**63),
    "float": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "double": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "string": lambda v: isinstance(v, str),
    "bytes": lambda v: isinstance(v, str),
    "enum": lambda v: isinstance(v, str),
    "fixed": lambda v: isinstance(v, str),
}
"""What a default of each non-container type must be in JSON (Java's ``isValidValue``)."""


def _check_defaults(tree: Any, bounded: bool) -> None:
    """Refuse a field default that does not match the field's type, as Avro's Java parser does.

    fastavro checks a default only at its top (a record default need only be an object), so a
    record default lacking a field or an array default holding a string would be registered,
    and read back as data of the wrong shape. A union default may match any branch; an enum or
    fixed default need only be text (Java's rules). ``tree`` is the normalised tree, whose
    references fastavro has already resolved. ``bounded``: at most :data:`MAX_DEFAULT_STEPS`
    comparisons over all defaults, else :class:`_TooCostly` naming the field.
    """
    names, records = _named_types(tree)
    check = _DefaultCheck(names, MAX_DEFAULT_STEPS if bounded else None)
    for record in records:
        for f in record["fields"]:
            if "default" not in f:
                continue
            where = f"default of field {f['name']!r} in {record['name']!r}"
            try:
                valid = check.matches(f["type"], f["default"])
            except RecursionError:
                raise InvalidSchema(f"Invalid schema: {where} nests too deep to check") from None
            except _TooCostly:
                raise _TooCostly(
                    f"Invalid schema: {where} takes more than {MAX_DEFAULT_STEPS} steps to check"
                    " against the field's type: simplify the default or its union"
                ) from None
            if not valid:
                default = json.dumps(f["default"], ensure_ascii=False)
                raise InvalidSchema(
                    f"Invalid schema: {where} does not match the field's type: {default[:80]}"
                )


def _named_types(tree: Any) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The named types of a normalised tree by full name, and its records."""
    names: dict[str, Any] = {}
    records: list[dict[str, Any]] = []
    pending: list[Any] = [tree]
    while pending:
        node = pending.pop()
        if isinstance(node, list):
            pending.extend(node)
        elif isinstance(node, dict):
            if node.get("type") in NAMED:
                names[node["name"]] = node
            if "fields" in node:
                records.append(node)
                pending.extend(f["type"] for f in node["fields"])
            pending.extend(node[k] for k in ("items", "values") if k in node)
    return names, records


class _TooCostly(Exception):
    """The defaults of one schema took more than MAX_DEFAULT_STEPS comparisons.

    Raised bare by the check; :func:`_check_defaults` raises it again with the message naming
    the field, which :func:`parse_json` gives :class:`DefaultsTooCostly`.
    """


class _DefaultCheck:
    """Java's ``isValidValue`` over one schema's defaults, memoised and bounded.

    A union default may match any branch, so a branch failing only deep down makes a nested
    default be checked once per branch per level (doubling per level through a recursive
    union). Only a union's branches reach one value by several ways, so each (union, object or
    array) pair is decided once; and a schema's defaults together get at most
    :data:`MAX_DEFAULT_STEPS` comparisons.
    """

    def __init__(self, names: dict[str, Any], limit: int | None) -> None:
        self.names = names
        self.limit = limit
        """Most steps, or None for no bound (a schema already stored)."""
        self.steps = 0
        self.known: dict[tuple[int, int], bool] = {}
        """Decided (union, object or array) pairs, by identity: both live as long as the check."""

    def matches(self, schema: Any, value: Any) -> bool:
        """Whether the JSON ``value`` is a valid default of ``schema``.

        Raises:
            _TooCostly: past the step bound.
        """
        self.steps += 1
        if self.limit is not None and self.steps > self.limit:
            raise _TooCostly
        if isinstance(schema, list):
            if not isinstance(value, dict | list):
                return any(self.matches(branch, value) for branch in schema)
            key = (id(schema), id(value))
            known = self.known.get(key)
            if known is None:
                known = any(self.matches(branch, value) for branch in schema)
                self.known[key] = known
            return known
        if isinstance(schema, str) and schema not in PRIMITIVES:
            schema = self.names[schema]
        kind = schema if isinstance(schema, str) else schema["type"]
        if kind in _SCALAR_DEFAULTS:
            return _SCALAR_DEFAULTS[kind](value)
        if kind == "array":
            return isinstance(value, list) and all(self.matches(schema["items"], v) for v in value)
        if kind == "map":
            return isinstance(value, dict) and all(
                self.matches(schema["values"], v) for v in value.values()
            )
        return isinstance(value, dict) and all(  # a record: a missing field needs its own default
            self.matches(f["type"], value[f["name"]]) if f["name"] in value else "default" in f
            for f in schema["fields"]
        )


def _full(name: str, namespace: str) -> str:
    return name if "." in name or not namespace else f"{namespace}.{name}"


def _check_name(name: Any, where: str) -> str:
    if not isinstance(name, str) or not all(_NAME.fullmatch(p) for p in name.split(".")):
        raise InvalidSchema(f"Invalid schema: invalid name {name!r} at {where}")
    return name


def _full_name(schema: dict[str, Any], namespace: str, where: str) -> str:
    """A named type's full name, its name and namespace checked as Avro's parsers check them."""
    name = _check_name(schema.get("name"), where)
    space = schema.get("namespace")
    if space is not None and not isinstance(space, str):
        raise InvalidSchema(f"Invalid schema: namespace must be a string at {where}")
    if space and not all(_NAME.fullmatch(p) for p in space.split(".")):
        raise InvalidSchema(f"Invalid schema: invalid namespace {space!r} at {where}")
    full = _full(name, space if space is not None else namespace)
    if full in PRIMITIVES:  # a reference to it would be ambiguous
        raise InvalidSchema(f"Invalid schema: {full!r} is a primitive type's name at {where}")
    return full


class _Normalizer:
    """One pass over the schema JSON: validates names and writes the normalised tree."""

    def __init__(self) -> None:
        self.defined: set[str] = set()
        self.depth = 0
        """Types entered and not yet left: the current nesting level."""

    def node(self, schema: Any, namespace: str, where: str) -> Any:
        if self.depth == MAX_DEPTH:
            raise InvalidSchema(
                f"Invalid schema: schema nests deeper than {MAX_DEPTH} levels at {where}"
            )
        self.depth += 1
        try:
            return self.type_(schema, namespace, where)
        finally:
            self.depth -= 1

    def type_(self, schema: Any, namespace: str, where: str) -> Any:
        if isinstance(schema, str):
            return self.reference(schema, namespace, where)
        if isinstance(schema, list):
            return self.union(schema, namespace, where)
        if not isinstance(schema, dict):
            raise InvalidSchema(f"Invalid schema: expected a type at {where}, got {schema!r}")
        kind = schema.get("type")
        if isinstance(kind, dict | list):  # Avro's parsers refuse a nested type here
            raise InvalidSchema(f"Invalid schema: 'type' must be a type name at {where}.type")
        if kind in NAMED:
            return self.named(schema, namespace, where)
        if kind in _CONTAINERS:
            return self.wrap(schema, _CONTAINERS[kind], namespace, where)
        if kind in PRIMITIVES and len(schema) > 1:
            return {"type": kind, **_rest(schema, ())}
        if "type" not in schema:
            raise InvalidSchema(f"Invalid schema: missing 'type' at {where}")
        return self.node(kind, namespace, f"{where}.type")  # "int", "com.x.Named" or nested

    def reference(self, schema: str, namespace: str, where: str) -> str:
        if schema in PRIMITIVES:
            return schema
        full = _full(_check_name(schema, where), namespace)
        if full in self.defined:
            return full
        if schema in self.defined and namespace:  # Avro's spec resolves it in the namespace
            raise InvalidSchema(
                f"Invalid schema: unknown type {full!r} at {where}: {schema!r} of no namespace"
                f" cannot be named from inside namespace {namespace!r}"
            )
        if schema not in self.defined:
            raise InvalidSchema(f"Invalid schema: unknown type {schema!r} at {where}")
        return schema

    def union(self, branches: list[Any], namespace: str, where: str) -> list[Any]:
        if not branches:
            raise InvalidSchema(f"Invalid schema: empty union at {where}")
        out: list[Any] = []
        seen: set[str] = set()
        for i, branch in enumerate(branches):
            if isinstance(branch, list):
                raise InvalidSchema(f"Invalid schema: a union directly inside a union at {where}")
            norm = self.node(branch, namespace, f"{where}[{i}]")
            key = norm if isinstance(norm, str) else norm.get("name") or norm["type"]
            if key in seen:
                raise InvalidSchema(f"Invalid schema: duplicate union branch {key!r} at {where}")
            seen.add(key)
            out.append(norm)
        return out

    def wrap(self, schema: dict[str, Any], key: str, namespace: str, where: str) -> Any:
        if key not in schema:
            raise InvalidSchema(f"Invalid schema: {schema['type']} without '{key}' at {where}")
        inner = self.node(schema[key], namespace, f"{where}.{key}")
        return {"type": schema["type"], key: inner, **_rest(schema, (key,))}

    def named(self, schema: dict[str, Any], namespace: str, where: str) -> dict[str, Any]:
        full = _full_name(schema, namespace, where)
        if full in self.defined:
            raise InvalidSchema(f"Invalid schema: type {full!r} is defined twice")
        self.defined.add(full)
        own_space = full.rpartition(".")[0]
        out: dict[str, Any] = {"name": full, "type": schema["type"]}
        kind = schema["type"]
        if kind in {"record", "error"}:
            out["fields"] = self.fields(schema, own_space, f"{where}<{full}>")
        elif kind == "enum":
            symbols = schema.get("symbols")
            if not isinstance(symbols, list) or not all(isinstance(s, str) for s in symbols):
                raise InvalidSchema(f"Invalid schema: enum {full!r} needs a list of symbols")
            out["symbols"] = symbols
        else:
            size = schema.get("size")
            if not isinstance(size, int) or isinstance(size, bool) or size < 0:
                raise InvalidSchema(f"Invalid schema: fixed {full!r} needs a size >= 0")
            out["size"] = size
        aliases = schema.get("aliases")
        if aliases is not None:
            if not isinstance(aliases, list):
                raise InvalidSchema(f"Invalid schema: aliases must be a list at {where}")
            out["aliases"] = sorted(_full(_check_name(a, where), own_space) for a in aliases)
        out.update(_rest(schema, ("symbols", "size", "fields")))
        return out

    def fields(self, schema: dict[str, Any], namespace: str, where: str) -> list[dict[str, Any]]:
        fields = schema.get("fields")
        if not isinstance(fields, list):
            raise InvalidSchema(f"Invalid schema: record without a 'fields' list at {where}")
        out: list[dict[str, Any]] = []
        names: set[str] = set()
        for f in fields:
            if not isinstance(f, dict) or "type" not in f:
                raise InvalidSchema(f"Invalid schema: field without a type at {where}")
            name = _check_name(f.get("name"), where)
            if "." in name or name in names:
                raise InvalidSchema(f"Invalid schema: bad or duplicate field name {name!r}")
            names.add(name)
            entry: dict[str, Any] = {"name": name}
            entry["type"] = self.node(f["type"], namespace, f"{where}.{name}")
            aliases = f.get("aliases")
            if aliases is not None:
                if not isinstance(aliases, list):
                    raise InvalidSchema(f"Invalid schema: aliases must be a list at {where}.{name}")
                entry["aliases"] = sorted(_check_name(a, where) for a in aliases)
            order = f.get("order", "ascending")
            if order not in _ORDERS:
                raise InvalidSchema(
                    "Invalid schema: order must be ascending, descending or ignore at "
                    f"{where}.{name}"
                )
            if order != "ascending":
                entry["order"] = order
            entry.update(_rest(f, ("order",)))
            out.append(entry)
        return out


def _rest(schema: dict[str, Any], skip: tuple[str, ...]) -> dict[str, Any]:
    """Attributes not normalised elsewhere, in sorted order (docs, defaults, custom props)."""
    return {k: schema[k] for k in sorted(schema) if k not in _HANDLED and k not in skip}
