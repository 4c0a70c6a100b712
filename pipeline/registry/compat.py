"""Schema compatibility: the Avro schema-resolution rules and the Confluent compatibility levels.

fastavro parses and resolves schemas but has no compatibility checker, so this module applies
the rules of the Avro specification ("Schema Resolution") the way Avro's Java
``SchemaCompatibility`` does, on the normalised trees of :mod:`pipeline.registry.canonical`:

* identical primitive types match; the promotions ``int -> long -> float -> double`` (writer to
  reader) and ``string <-> bytes`` are allowed; logical types follow their underlying type;
* records, enums and fixed match by unqualified name, or by a reader alias naming the writer's
  full name; a reader field is found in the writer by name or by one of the field's aliases, and
  a reader field the writer lacks needs a default; writer fields the reader lacks are skipped;
* an enum reader must hold every writer symbol unless it declares an enum ``default``;
* fixed sizes must be equal; arrays and maps compare their items and values;
* a writer union needs every branch readable; a reader union needs one branch that reads the
  (non-union) writer.

A level says which directions are checked and against which earlier versions:

============================  ====================================  ========================
level                         check                                 against
============================  ====================================  ========================
BACKWARD                      new schema reads data of the old      the latest version
FORWARD                       old schema reads data of the new      the latest version
FULL                          both                                  the latest version
BACKWARD/FORWARD/FULL         same directions                       every live version
_TRANSITIVE
NONE                          nothing                               -
============================  ====================================  ========================

Each broken rule is an :class:`Incompatibility` naming the rule (Java's names, such as
``READER_FIELD_MISSING_DEFAULT_VALUE``), the field path (``Order.customer.address.zip``) and a
JSON-pointer location in the reader schema.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from pipeline.config import Compatibility
from pipeline.registry.canonical import NAMED, PRIMITIVES, ParsedSchema

_PROMOTIONS: dict[str, frozenset[str]] = {
    "long": frozenset({"int"}),
    "float": frozenset({"int", "long"}),
    "double": frozenset({"int", "long", "float"}),
    "bytes": frozenset({"string"}),
    "string": frozenset({"bytes"}),
}
_READERS_OF: dict[str, tuple[str, ...]] = {
    writer: (writer, *sorted(r for r, sources in _PROMOTIONS.items() if writer in sources))
    for writer in PRIMITIVES
}
"""The reader types that can read each primitive writer type (itself, then its promotions)."""


@dataclass(frozen=True, slots=True)
class Incompatibility:
    """One broken schema-resolution rule.

    Attributes:
        rule: the rule's name, e.g. ``READER_FIELD_MISSING_DEFAULT_VALUE``.
        path: the field path from the top-level type, e.g. ``Order.items[].price``.
        location: JSON pointer into the reader schema, e.g. ``/fields/1/type/items``.
        detail: what is wrong, in words.
    """

    rule: str
    path: str
    location: str
    detail: str

    def __str__(self) -> str:
        """One line: rule, field path, location and detail."""
        return f"{self.rule} at '{self.path}' ({self.location}): {self.detail}"


def _index(tree: Any, names: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    if isinstance(tree, list):
        for branch in tree:
            _index(branch, names)
    elif isinstance(tree, dict):
        if tree.get("type") in NAMED:
            names[tree["name"]] = tree
        for f in tree.get("fields", ()):
            _index(f["type"], names)
        for key in ("items", "values"):
            if key in tree:
                _index(tree[key], names)
    return names


def _short(name: str) -> str:
    return name.rpartition(".")[2]


@dataclass(frozen=True, slots=True)
class _UnionIndex:
    """A reader union's branch positions by what a writer type must share to be read by them.

    Only the branches listed for a writer type can read it: any other fails at once (a type or
    name mismatch, before any recursion), so skipping it changes neither the answer nor what
    the checker memoises, and a union against a union costs about its size, not its square.
    Branches sharing one unqualified name (in several namespaces) are still each tried, in
    order, as Avro's Java checker tries them.
    """

    by_type: dict[str, list[int]]
    """Unnamed branches (primitives, with or without a logical type, array, map) by type."""
    by_name: dict[str, list[int]]
    """Named branches by unqualified name and by each of their aliases."""

    def candidates(self, writer: Any, branch_count: int) -> Sequence[int]:
        """Positions of the branches that may read ``writer`` (resolved, not a union), in order."""
        kind = _type_name(writer)
        if kind in NAMED:
            found = {*self.by_name.get(_short(writer["name"]), ())}
            found.update(self.by_name.get(writer["name"], ()))
            return sorted(found)
        if kind in _READERS_OF:
            return sorted(i for reader in _READERS_OF[kind] for i in self.by_type.get(reader, ()))
        if kind in {"array", "map"}:
            return self.by_type.get(kind, [])
        return range(branch_count)  # not a known type: try every branch, as before


def _type_name(schema: Any) -> str:
    if isinstance(schema, list):
        return "union"
    if isinstance(schema, str):
        return schema
    return str(schema["type"])


class _Checker:
    """Whether a reader schema can read everything a writer schema writes."""

    def __init__(self, reader: ParsedSchema, writer: ParsedSchema) -> None:
        self.reader_names = _index(reader.tree, {})
        self.writer_names = _index(writer.tree, {})
        self.in_progress: set[tuple[str, str]] = set()
        self.unions: dict[int, _UnionIndex] = {}
        """Index of each reader union, by the list's id (the trees outlive the checker)."""
        self.symbols: dict[int, frozenset[str]] = {}
        """Symbols of each reader enum as a set, by the enum's id."""
        self.done: dict[tuple[str, str], list[Incompatibility]] = {}
        """Problems of each (reader, writer) pair of named records already checked: a type
        referenced many times is checked once, so the work is linear in the schemas' size
        (without it, two references per level double the work per level)."""

    def resolve(self, schema: Any, names: dict[str, dict[str, Any]]) -> Any:
        if isinstance(schema, str) and schema not in PRIMITIVES:
            return names[schema]
        return schema

    def check(self, reader: Any, writer: Any, path: str, loc: str) -> Iterator[Incompatibility]:
        reader = self.resolve(reader, self.reader_names)
        writer = self.resolve(writer, self.writer_names)
        r_type, w_type = _type_name(reader), _type_name(writer)
        if "union" in {r_type, w_type}:
            yield from self.union(reader, writer, path, loc)
        elif r_type in PRIMITIVES or w_type in PRIMITIVES:
            if r_type != w_type and w_type not in _PROMOTIONS.get(r_type, ()):
                yield Incompatibility(
                    "TYPE_MISMATCH", path, loc, f"reader type {r_type} cannot read writer {w_type}"
                )
        elif r_type != w_type and {r_type, w_type} != {"record", "error"}:
            yield Incompatibility(
                "TYPE_MISMATCH", path, loc, f"reader type {r_type} cannot read writer {w_type}"
            )
        elif r_type == "array":
            yield from self.check(reader["items"], writer["items"], f"{path}[]", f"{loc}/items")
        elif r_type == "map":
            yield from self.check(
                reader["values"], writer["values"], f"{path}{{}}", f"{loc}/values"
            )
        else:
            yield from self.named(reader, writer, path, loc)

    def union(self, reader: Any, writer: Any, path: str, loc: str) -> Iterator[Incompatibility]:
        if isinstance(writer, list):  # every branch the writer may write must be readable
            for i, branch in enumerate(writer):
                problems = list(self.check(reader, branch, path, loc))
                if problems and isinstance(reader, list):
                    yield Incompatibility(
                        "MISSING_UNION_BRANCH",
                        path,
                        loc,
                        f"reader union lacks writer union branch {i} ({_describe(branch)})",
                    )
                else:
                    yield from problems
        elif not any(
            not list(self.check(reader[i], writer, path, f"{loc}/{i}"))
            for i in self.union_index(reader).candidates(writer, len(reader))
        ):
            yield Incompatibility(
                "MISSING_UNION_BRANCH",
                path,
                loc,
                f"reader union has no branch that reads writer type {_describe(writer)}",
            )

    def union_index(self, reader: list[Any]) -> _UnionIndex:
        index = self.unions.get(id(reader))
        if index is None:
            index = _UnionIndex({}, {})
            for i, branch in enumerate(reader):
                resolved = self.resolve(branch, self.reader_names)
                if _type_name(resolved) in NAMED:
                    for key in {_short(resolved["name"]), *resolved.get("aliases", ())}:
                        index.by_name.setdefault(key, []).append(i)
                else:
                    index.by_type.setdefault(_type_name(resolved), []).append(i)
            self.unions[id(reader)] = index
        return index

    def named(
        self, reader: dict[str, Any], writer: dict[str, Any], path: str, loc: str
    ) -> Iterator[Incompatibility]:
        if _short(reader["name"]) != _short(writer["name"]) and writer["name"] not in reader.get(
            "aliases", ()
        ):
            yield Incompatibility(
                "NAME_MISMATCH",
                path,
                f"{loc}/name",
                f"reader name {reader['name']} matches neither writer name {writer['name']} "
                "nor a reader alias",
            )
            return
        kind = reader["type"]
        if kind == "fixed" and reader["size"] != writer["size"]:
            yield Incompatibility(
                "FIXED_SIZE_MISMATCH",
                path,
                f"{loc}/size",
                f"reader size {reader['size']}, writer size {writer['size']}",
            )
        elif kind == "enum":
            symbols = self.symbols.get(id(reader))
            if symbols is None:
                symbols = self.symbols[id(reader)] = frozenset(reader["symbols"])
            missing = [s for s in writer["symbols"] if s not in symbols]
            if missing and "default" not in reader:
                yield Incompatibility(
                    "MISSING_ENUM_SYMBOLS",
                    path,
                    f"{loc}/symbols",
                    f"reader enum lacks writer symbols {missing} and has no default",
                )
        elif kind in {"record", "error"}:
            key = (reader["name"], writer["name"])
            if key in self.done:  # reported at its first path; repeated for union tests only
                yield from self.done[key]
                return
            if key in self.in_progress:  # a recursive type: assume it holds while checking it
                return
            self.in_progress.add(key)
            try:
                problems = list(dict.fromkeys(self.fields(reader, writer, path, loc)))
            finally:
                self.in_progress.discard(key)
            self.done[key] = problems
            yield from problems

    def fields(
        self, reader: dict[str, Any], writer: dict[str, Any], path: str, loc: str
    ) -> Iterator[Incompatibility]:
        by_name = {f["name"]: f for f in writer["fields"]}
        for i, r_field in enumerate(reader["fields"]):
            field_path = f"{path}.{r_field['name']}" if path else r_field["name"]
            field_loc = f"{loc}/fields/{i}"
            w_field = next(
                (
                    by_name[n]
                    for n in (r_field["name"], *r_field.get("aliases", ()))
                    if n in by_name
                ),
                None,
            )
            if w_field is None:
                if "default" not in r_field:
                    yield Incompatibility(
                        "READER_FIELD_MISSING_DEFAULT_VALUE",
                        field_path,
                        field_loc,
                        f"reader field '{r_field['name']}' is missing in the writer schema "
                        "and has no default value",
                    )
                continue
            yield from self.check(r_field["type"], w_field["type"], field_path, f"{field_loc}/type")


def _describe(schema: Any) -> str:
    if isinstance(schema, dict) and "name" in schema:
        return f"{schema['type']} {schema['name']}"
    return _type_name(schema)


def can_read(reader: ParsedSchema, writer: ParsedSchema) -> list[Incompatibility]:
    """Every rule broken when ``reader`` reads data written with ``writer``; empty if none."""
    top = reader.tree
    root = _short(top["name"]) if isinstance(top, dict) and "name" in top else ""
    return list(dict.fromkeys(_Checker(reader, writer).check(reader.tree, writer.tree, root, "")))


def check(
    new: ParsedSchema,
    previous: Sequence[tuple[int, ParsedSchema]],
    level: Compatibility,
) -> list[str]:
    """Check ``new`` against the live earlier versions under ``level``.

    Args:
        new: the candidate schema.
        previous: ``(version, schema)`` pairs of the subject's live versions, oldest first.
        level: the compatibility level in force.

    Returns:
        One message per broken rule, naming the version, the direction, the rule and the field
        path; empty when the schema is compatible.
    """
    if level is Compatibility.NONE or not previous:
        return []
    against = previous if level.transitive else previous[-1:]
    messages: list[str] = []
    for version, old in reversed(against):
        if level.backward:
            messages.extend(
                f"version {version}: new schema cannot read data written with it "
                f"({level.value} check): {problem}"
                for problem in can_read(new, old)
            )
        if level.forward:
            messages.extend(
                f"version {version}: it cannot read data written with the new schema "
                f"({level.value} check): {problem}"
                for problem in can_read(old, new)
            )
    return messages
