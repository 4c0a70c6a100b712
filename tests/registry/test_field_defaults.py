"""Field defaults are checked against the field's type the way Avro's Java parser checks them."""

from __future__ import annotations

from typing import Any

import pytest

from pipeline.registry.canonical import parse_json
from pipeline.registry.errors import InvalidSchema

_S = {"type": "record", "name": "S", "fields": [{"name": "x", "type": "int"}]}


def with_field(type_: Any, default: Any) -> dict[str, Any]:
    """A record R whose one field ``a`` has the given type and default."""
    return {
        "type": "record",
        "name": "R",
        "fields": [{"name": "a", "type": type_, "default": default}],
    }


# (id, field type, default): each refused by Avro's Java parser (1.12) as "Invalid default"
INVALID: list[tuple[str, Any, Any]] = [
    ("record field of the wrong type", _S, {"x": "str"}),
    ("record field missing and without default", _S, {}),
    ("array item of the wrong type", {"type": "array", "items": "int"}, ["x"]),
    ("map value of the wrong type", {"type": "map", "values": "int"}, {"k": "x"}),
    ("no union branch matches", [_S, "null"], {"x": "s"}),
    ("int out of range", "int", 3_000_000_000),
    ("long out of range", "long", 2**63),
    ("boolean for an int", "int", True),
    ("nested record field wrong", {"type": "array", "items": _S}, [{"x": 1}, {"x": None}]),
]

# (id, field type, default): each accepted by Avro's Java parser (1.12)
VALID: list[tuple[str, Any, Any]] = [
    (
        "record field missing but defaulted",
        {**_S, "fields": [{"name": "x", "type": "int", "default": 3}]},
        {},
    ),
    ("record field given", _S, {"x": 1}),
    ("union default of a later branch", ["null", "int"], 1),
    ("int for a float", "float", 1),
    ("array of records", {"type": "array", "items": _S}, [{"x": 1}]),
    ("map of longs", {"type": "map", "values": "long"}, {"k": 2**62}),
    ("fixed as text", {"type": "fixed", "name": "F", "size": 2}, "ab"),
]


@pytest.mark.parametrize(
    ("type_", "default"), [c[1:] for c in INVALID], ids=[c[0] for c in INVALID]
)
def test_a_default_that_does_not_match_its_type_is_an_invalid_schema(
    type_: Any, default: Any
) -> None:
    """A field default that Avro's Java parser refuses is refused, naming the field."""
    with pytest.raises(InvalidSchema, match="default of field 'a' in 'R'"):
        parse_json(with_field(type_, default))


@pytest.mark.parametrize(("type_", "default"), [c[1:] for c in VALID], ids=[c[0] for c in VALID])
def test_a_default_that_matches_its_type_is_accepted(type_: Any, default: Any) -> None:
    """A field default that Avro's Java parser accepts is accepted and kept."""
    parsed = parse_json(with_field(type_, default))
    assert parsed.tree["fields"][0]["default"] == default


def test_a_recursive_record_default_is_checked_without_looping() -> None:
    """A recursive record's default is checked once per level of the value, not forever."""
    node: dict[str, Any] = {
        "type": "record",
        "name": "Node",
        "fields": [{"name": "next", "type": ["null", "Node"], "default": None}],
    }
    parse_json(with_field(node, {"next": {"next": None}}))
    parse_json(with_field(node, {}))
    with pytest.raises(InvalidSchema, match="default of field 'a' in 'R'"):
        parse_json(with_field(node, {"next": {"next": 5}}))
