"""Wide unions and long enums parse and are checked in about their size, with the same answers.

A union against a union used to check each writer branch against each reader branch (two
unions of 4000 records took about 37 s) and enum symbols were found by list search (40 000
symbols, 18 s). These tests assert the answers at sizes where that cost showed (a quadratic
checker takes many seconds here); they never assert on time.
"""

from __future__ import annotations

import json
import random
from typing import Any

import httpx
import pytest

from pipeline.registry.canonical import ParsedSchema, parse_json
from pipeline.registry.compat import can_read

WIDE = 3000


def parsed(schema: Any) -> ParsedSchema:
    """Parse a schema given as JSON values."""
    return parse_json(json.loads(json.dumps(schema)))


def records(names: list[str], **fields: str) -> list[dict[str, Any]]:
    """One record branch per name, each with ``fields`` (name -> type)."""
    return [
        {
            "type": "record",
            "name": name,
            "fields": [{"name": f, "type": t} for f, t in fields.items()],
        }
        for name in names
    ]


def names(count: int, prefix: str = "R") -> list[str]:
    """``count`` distinct record names."""
    return [f"{prefix}{i}" for i in range(count)]


def test_a_union_as_wide_as_a_body_allows_parses_to_its_canonical_form() -> None:
    """12 000 branches (about 600 KiB, under the default body cap) parse to the right form.

    fastavro's canonical form of an already parsed union copied every named type into each
    branch: 13 s at this width.
    """
    branches = records(names(4 * WIDE), a="int")
    schema = parse_json(branches)
    assert schema.canonical.count('"type":"record"') == 4 * WIDE
    assert schema.canonical.startswith('[{"name":"R0","type":"record","fields":[{"name":"a"')


def test_identical_wide_unions_are_compatible() -> None:
    """Every writer branch finds its reader branch by name."""
    union = records(names(WIDE), a="int")
    assert can_read(parsed(union), parsed(union)) == []


def test_a_wide_writer_union_names_each_branch_the_reader_lacks() -> None:
    """Branches missing from the reader, or unreadable by theirs, are each reported once."""
    writer = records(names(WIDE), a="int")
    reader = records(names(WIDE)[:-1], a="long")  # int -> long promotes; R2999 is missing
    reader[10]["fields"][0]["type"] = "string"  # R10 can no longer read int
    problems = can_read(parsed(reader), parsed(writer))
    assert [p.rule for p in problems] == ["MISSING_UNION_BRANCH"] * 2
    assert "branch 10 (record R10)" in problems[0].detail
    assert f"branch {WIDE - 1} (record R{WIDE - 1})" in problems[1].detail


def test_wide_unions_in_reverse_order_with_namespaces_and_aliases() -> None:
    """Order does not matter; an unqualified name or a reader alias still matches."""
    writer = records([f"w.R{i}" for i in range(WIDE)], a="int")
    reader = records([f"r.R{i}" for i in reversed(range(WIDE))], a="int")  # same short names
    reader[0]["name"] = "r.Renamed"
    reader[0]["aliases"] = [f"w.R{WIDE - 1}"]
    assert can_read(parsed(reader), parsed(writer)) == []


def test_a_wide_reader_union_reads_each_primitive_by_promotion() -> None:
    """Primitives and logical types find their reader branch by type or promotion."""
    reader = ["null", "double", "string", *records(names(WIDE))]
    writer = [
        "int",
        {"type": "long", "logicalType": "timestamp-millis"},
        "float",
        "bytes",
        "null",
        *records(names(WIDE)),
    ]
    assert can_read(parsed(reader), parsed(writer)) == []
    problems = can_read(parsed(reader), parsed([*writer, "boolean"]))
    assert [p.detail for p in problems] == [
        f"reader union lacks writer union branch {len(writer)} (boolean)"
    ]


def test_long_enums_compare_their_symbols_as_sets() -> None:
    """The reader's symbols in any order read the writer's; a lacking symbol is named."""
    symbols = [f"S{i}" for i in range(WIDE * 10)]
    writer = {"type": "enum", "name": "E", "symbols": symbols}
    reader = {"type": "enum", "name": "E", "symbols": symbols[::-1]}
    assert can_read(parsed(reader), parsed(writer)) == []
    reader["symbols"] = symbols[1:]
    problems = can_read(parsed(reader), parsed(writer))
    assert [p.rule for p in problems] == ["MISSING_ENUM_SYMBOLS"]
    assert "['S0']" in problems[0].detail


BRANCHES: list[Any] = [
    "null",
    "boolean",
    "int",
    "long",
    "float",
    "double",
    "bytes",
    "string",
    {"type": "int", "logicalType": "date"},
    {"type": "array", "items": "int"},
    {"type": "array", "items": "long"},
    {"type": "map", "values": "string"},
    {"type": "map", "values": "bytes"},
    {"type": "enum", "name": "a.E", "symbols": ["X", "Y"]},
    {"type": "enum", "name": "b.E", "symbols": ["X"]},
    {"type": "fixed", "name": "a.F", "size": 4},
    {"type": "fixed", "name": "b.F", "size": 8},
    {"type": "record", "name": "a.R", "fields": [{"name": "x", "type": "int"}]},
    {"type": "record", "name": "b.R", "fields": [{"name": "y", "type": "int"}]},
    {"type": "error", "name": "c.R", "fields": []},
    {"type": "record", "name": "d.S", "aliases": ["a.R"], "fields": []},
]


def branch_key(branch: Any) -> str:
    """What makes a branch unique in a union: its name, else its type."""
    return branch if isinstance(branch, str) else branch.get("name", branch["type"])


def pick(rng: random.Random) -> list[Any]:
    """A random union of distinct branches (at most one per type for unnamed ones)."""
    chosen: dict[str, Any] = {}
    for branch in rng.sample(BRANCHES, rng.randint(1, len(BRANCHES))):
        kind = branch_key(branch)
        if isinstance(branch, dict) and "name" not in branch:
            kind = branch["type"]
        chosen.setdefault(kind, branch)
    return list(chosen.values())


@pytest.mark.parametrize("seed", range(40))
def test_a_union_against_a_union_answers_as_branch_against_branch(seed: int) -> None:
    """The indexed check reports exactly the writer branches no reader branch reads alone."""
    rng = random.Random(seed)
    reader, writer = pick(rng), pick(rng)
    unreadable = [
        i
        for i, w in enumerate(writer)
        if not any(can_read(parsed(r), parsed(w)) == [] for r in reader)
    ]
    problems = can_read(parsed(reader), parsed(writer))
    assert {p.rule for p in problems} <= {"MISSING_UNION_BRANCH"}
    reported = [int(p.detail.split("branch ")[1].split(" ")[0]) for p in problems]
    assert reported == unreadable


def test_a_wide_union_registers_and_evolves_through_the_api(registry_url: str) -> None:
    """On each store: a wider union is backward compatible, a narrower one names its loss."""
    versions = f"{registry_url}/subjects/wide/versions"

    def register(branches: list[Any]) -> httpx.Response:
        return httpx.post(versions, json={"schema": json.dumps(branches)}, timeout=60)

    assert register(records(names(WIDE))).status_code == 200
    assert register(records(names(WIDE + 1))).status_code == 200
    refused = register(records(names(WIDE + 1)[1:]))
    assert refused.status_code == 409, refused.text
    assert refused.json()["message"].count("MISSING_UNION_BRANCH") == 1
    assert "branch 0 (record R0)" in refused.json()["message"]
