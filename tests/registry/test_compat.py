"""The Avro schema-resolution rules and compatibility levels, each at top level and nested."""

from __future__ import annotations

import json
from typing import Any

import pytest

from pipeline.config import Compatibility
from pipeline.registry.canonical import ParsedSchema, parse_json
from pipeline.registry.compat import can_read, check


def rec(name: str, *fields: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """A record schema."""
    return {"type": "record", "name": name, "fields": list(fields), **extra}


def fld(name: str, type_: Any, **extra: Any) -> dict[str, Any]:
    """A record field."""
    return {"name": name, "type": type_, **extra}


def enum(symbols: list[str], **extra: Any) -> dict[str, Any]:
    """An enum schema named Color."""
    return {"type": "enum", "name": "Color", "symbols": symbols, **extra}


def fixed(size: int, name: str = "Hash") -> dict[str, Any]:
    """A fixed schema."""
    return {"type": "fixed", "name": name, "size": size}


# (id, reader schema, writer schema, rule broken or None when the reader can read the writer)
RESOLUTION_CASES: list[tuple[str, Any, Any, str | None]] = [
    ("same record", rec("R", fld("a", "int")), rec("R", fld("a", "int")), None),
    (
        "reader adds field with default",
        rec("R", fld("a", "int"), fld("b", "string", default="x")),
        rec("R", fld("a", "int")),
        None,
    ),
    (
        "reader adds field without default",
        rec("R", fld("a", "int"), fld("b", "string")),
        rec("R", fld("a", "int")),
        "READER_FIELD_MISSING_DEFAULT_VALUE",
    ),
    (
        "reader drops a writer field",
        rec("R", fld("a", "int")),
        rec("R", fld("a", "int"), fld("b", "string")),
        None,
    ),
    ("int promotes to long", "long", "int", None),
    ("int promotes to float", "float", "int", None),
    ("int promotes to double", "double", "int", None),
    ("long promotes to float", "float", "long", None),
    ("long promotes to double", "double", "long", None),
    ("float promotes to double", "double", "float", None),
    ("string reads bytes", "string", "bytes", None),
    ("bytes reads string", "bytes", "string", None),
    ("long does not narrow to int", "int", "long", "TYPE_MISMATCH"),
    ("double does not narrow to float", "float", "double", "TYPE_MISMATCH"),
    ("int is not string", "string", "int", "TYPE_MISMATCH"),
    (
        "logical type follows its base type",
        {"type": "long", "logicalType": "timestamp-millis"},
        "int",
        None,
    ),
    ("enum reader adds a symbol", enum(["R", "G", "B"]), enum(["R", "G"]), None),
    ("enum reader lacks a symbol", enum(["R"]), enum(["R", "G"]), "MISSING_ENUM_SYMBOLS"),
    (
        "enum reader lacks a symbol but has a default",
        enum(["R"], default="R"),
        enum(["R", "G"]),
        None,
    ),
    ("enum renamed", {**enum(["R"]), "name": "Colour"}, enum(["R"]), "NAME_MISMATCH"),
    (
        "enum renamed with alias",
        {**enum(["R"]), "name": "Colour", "aliases": ["Color"]},
        enum(["R"]),
        None,
    ),
    ("non-union writer into reader union", ["null", "int"], "int", None),
    ("non-union writer promoted into reader union", ["null", "long"], "int", None),
    ("writer union into non-union reader", "int", ["null", "int"], "TYPE_MISMATCH"),
    (
        "writer union branch missing in reader union",
        ["null", "int"],
        ["null", "int", "string"],
        "MISSING_UNION_BRANCH",
    ),
    ("reader union without a matching branch", ["null", "int"], "string", "MISSING_UNION_BRANCH"),
    ("writer union subset of reader union", ["null", "int", "string"], ["int", "null"], None),
    (
        "array items promote",
        {"type": "array", "items": "long"},
        {"type": "array", "items": "int"},
        None,
    ),
    (
        "array items narrow",
        {"type": "array", "items": "int"},
        {"type": "array", "items": "long"},
        "TYPE_MISMATCH",
    ),
    (
        "map values promote",
        {"type": "map", "values": "double"},
        {"type": "map", "values": "float"},
        None,
    ),
    (
        "map values mismatch",
        {"type": "map", "values": "int"},
        {"type": "map", "values": "string"},
        "TYPE_MISMATCH",
    ),
    (
        "array is not map",
        {"type": "array", "items": "int"},
        {"type": "map", "values": "int"},
        "TYPE_MISMATCH",
    ),
    ("fixed same size", fixed(16), fixed(16), None),
    ("fixed size changed", fixed(32), fixed(16), "FIXED_SIZE_MISMATCH"),
    ("fixed renamed", fixed(16, "Digest"), fixed(16), "NAME_MISMATCH"),
    ("record renamed", rec("S", fld("a", "int")), rec("R", fld("a", "int")), "NAME_MISMATCH"),
    (
        "record renamed with an alias naming the old full name",
        rec("S", fld("a", "int"), namespace="ns", aliases=["ns.R"]),
        rec("R", fld("a", "int"), namespace="ns"),
        None,
    ),
    (
        "record moved to another namespace keeps its short name",
        rec("R", fld("a", "int"), namespace="new"),
        rec("R", fld("a", "int"), namespace="old"),
        None,
    ),
    (
        "field renamed with an alias",
        rec("R", fld("b", "int", aliases=["a"])),
        rec("R", fld("a", "int")),
        None,
    ),
    (
        "field renamed without an alias or default",
        rec("R", fld("b", "int")),
        rec("R", fld("a", "int")),
        "READER_FIELD_MISSING_DEFAULT_VALUE",
    ),
    (
        "nested record field changes type",
        rec("R", fld("addr", rec("Addr", fld("zip", "int")))),
        rec("R", fld("addr", rec("Addr", fld("zip", "string")))),
        "TYPE_MISMATCH",
    ),
    (
        "recursive type with a new defaulted field",
        rec("Node", fld("v", "int"), fld("next", ["null", "Node"]), fld("w", "int", default=0)),
        rec("Node", fld("v", "int"), fld("next", ["null", "Node"])),
        None,
    ),
    ("record is not a primitive", rec("R", fld("a", "int")), "int", "TYPE_MISMATCH"),
]


def nested(schema: Any) -> Any:
    """``schema`` as the type of a field inside an outer record."""
    return rec("Outer", fld("inner", schema))


def parsed(schema: Any) -> ParsedSchema:
    """Parse a schema given as JSON values."""
    return parse_json(json.loads(json.dumps(schema)))


@pytest.mark.parametrize("depth", ["top", "nested"])
@pytest.mark.parametrize(
    ("reader", "writer", "rule"),
    [case[1:] for case in RESOLUTION_CASES],
    ids=[case[0] for case in RESOLUTION_CASES],
)
def test_resolution_rule(reader: Any, writer: Any, rule: str | None, depth: str) -> None:
    """A reader reads a writer exactly when the Avro resolution rules allow, at any depth."""
    if depth == "nested":
        reader, writer = nested(reader), nested(writer)
    problems = can_read(parsed(reader), parsed(writer))
    if rule is None:
        assert problems == []
    else:
        assert problems, "expected an incompatibility"
        assert {p.rule for p in problems} == {rule}
        if depth == "nested":
            assert all(p.path.startswith("Outer.inner") for p in problems)
            assert all(p.location.startswith("/fields/0/type") for p in problems)


def test_messages_name_field_path_and_rule() -> None:
    """A verbose message names the version, direction, rule and the dotted field path."""
    old = parsed(
        rec(
            "Order",
            fld("customer", rec("Customer", fld("address", rec("Address", fld("zip", "int"))))),
        )
    )
    new = parsed(
        rec(
            "Order",
            fld(
                "customer",
                rec(
                    "Customer",
                    fld("address", rec("Address", fld("zip", "int"), fld("city", "string"))),
                ),
            ),
        )
    )
    [message] = check(new, [(1, old)], Compatibility.BACKWARD)
    assert "version 1" in message
    assert "READER_FIELD_MISSING_DEFAULT_VALUE" in message
    assert "Order.customer.address.city" in message
    assert "/fields/0/type/fields/0/type/fields/1" in message


V1 = rec("R", fld("a", "int"))
V1_B_REQUIRED = rec("R", fld("a", "int"), fld("b", "string"))
V2_B_DEFAULT = rec("R", fld("a", "int"), fld("b", "string", default="x"))
V3_B_REQUIRED = rec("R", fld("a", "int"), fld("b", "string"))

LEVEL_CASES = [
    # (id, previous versions oldest first, new schema, level, compatible)
    ("backward ok against latest only", [V1, V2_B_DEFAULT], V3_B_REQUIRED, "BACKWARD", True),
    (
        "backward transitive sees v1",
        [V1, V2_B_DEFAULT],
        V3_B_REQUIRED,
        "BACKWARD_TRANSITIVE",
        False,
    ),
    ("forward: old reads new without b", [V2_B_DEFAULT], V1, "FORWARD", True),
    ("forward checks latest only", [V1_B_REQUIRED, V2_B_DEFAULT], V1, "FORWARD", True),
    ("forward transitive sees v1", [V1_B_REQUIRED, V2_B_DEFAULT], V1, "FORWARD_TRANSITIVE", False),
    ("full needs both directions", [V1], V1_B_REQUIRED, "FULL", False),
    ("full with a defaulted field", [V1], V2_B_DEFAULT, "FULL", True),
    ("full transitive sees v1", [V1_B_REQUIRED, V2_B_DEFAULT], V1, "FULL_TRANSITIVE", False),
    ("full transitive all defaulted", [V1, V2_B_DEFAULT], V2_B_DEFAULT, "FULL_TRANSITIVE", True),
    ("none allows anything", [V1], rec("R", fld("z", "bytes")), "NONE", True),
    ("first version is always fine", [], V1_B_REQUIRED, "FULL_TRANSITIVE", True),
]


@pytest.mark.parametrize(
    ("previous", "new", "level", "compatible"),
    [case[1:] for case in LEVEL_CASES],
    ids=[case[0] for case in LEVEL_CASES],
)
def test_compatibility_level(previous: list[Any], new: Any, level: str, compatible: bool) -> None:
    """Each level checks its directions against the latest or every earlier version."""
    history = [(i + 1, parsed(s)) for i, s in enumerate(previous)]
    problems = check(parsed(new), history, Compatibility(level))
    assert (problems == []) is compatible, problems
