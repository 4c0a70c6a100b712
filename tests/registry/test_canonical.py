"""Schema parsing, normalisation and fingerprints."""

from __future__ import annotations

import json

import pytest

from pipeline.registry.canonical import parse
from pipeline.registry.errors import InvalidSchema

BASE = {
    "type": "record",
    "name": "User",
    "namespace": "com.acme",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "kind", "type": {"type": "enum", "name": "Kind", "symbols": ["A", "B"]}},
        {"name": "again", "type": ["null", "Kind"], "default": None},
    ],
}


def test_formatting_and_namespaces_do_not_change_identity() -> None:
    """Whitespace, key order, namespace vs full names and {"type": "long"} normalise away."""
    variant = {
        "fields": [
            {"type": {"type": "long"}, "name": "id"},
            {
                "type": {"symbols": ["A", "B"], "name": "com.acme.Kind", "type": "enum"},
                "name": "kind",
            },
            {"default": None, "name": "again", "type": ["null", "com.acme.Kind"]},
        ],
        "name": "com.acme.User",
        "type": "record",
    }
    a, b = parse(json.dumps(BASE)), parse(json.dumps(variant, indent=4))
    assert a.normalized == b.normalized
    assert a.fingerprint == b.fingerprint
    assert '"namespace"' not in a.normalized
    assert '"name":"com.acme.Kind"' in a.normalized


def test_meaningful_attributes_change_identity_but_not_canonical_form() -> None:
    """Docs, defaults and aliases are kept in the identity but dropped from the canonical form."""
    documented = json.loads(json.dumps(BASE))
    documented["doc"] = "a user"
    documented["fields"][0]["default"] = 0
    a, b = parse(json.dumps(BASE)), parse(json.dumps(documented))
    assert a.fingerprint != b.fingerprint
    assert a.canonical == b.canonical
    assert a.rabin_fingerprint == b.rabin_fingerprint


def test_parsing_canonical_form_follows_the_spec() -> None:
    """The canonical form strips everything but names, types, fields, symbols, items, sizes."""
    assert parse(json.dumps(BASE)).canonical == (
        '{"name":"com.acme.User","type":"record","fields":[{"name":"id","type":"long"},'
        '{"name":"kind","type":{"name":"com.acme.Kind","type":"enum","symbols":["A","B"]}},'
        '{"name":"again","type":["null","com.acme.Kind"]}]}'
    )
    assert parse('{"type": "int"}').canonical == '"int"'


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("{", "not valid JSON"),
        ("42", "expected a type"),
        ('"Unknown"', "unknown type"),
        ("[]", "empty union"),
        ('["int", "int"]', "duplicate union branch"),
        ('["null", ["int"]]', "union directly inside a union"),
        ('{"type": "record", "name": "R"}', "fields"),
        ('{"type": "record", "name": "1R", "fields": []}', "invalid name"),
        (
            (
                '{"type": "record", "name": "R", "fields": [{"name": "a", "type": "int"}, '
                '{"name": "a", "type": "int"}]}'
            ),
            "duplicate field",
        ),
        ('{"type": "record", "name": "R", "fields": [{"name": "a"}]}', "field without a type"),
        (
            (
                '{"type": "record", "name": "R", "fields": [{"name": "a", "type": "int", '
                '"default": "x"}]}'
            ),
            "Default value",
        ),
        ('{"type": "enum", "name": "E", "symbols": ["A", "A"]}', "unique"),
        ('{"type": "enum", "name": "E", "symbols": ["A"], "default": "B"}', "symbols"),
        ('{"type": "fixed", "name": "F"}', "size"),
        ('{"type": "array"}', "items"),
        ('{"type": "map", "values": "nope"}', "unknown type"),
        (
            (
                '{"type": "record", "name": "R", "fields": [{"name": "a", "type": '
                '{"type": "fixed", "name": "R", "size": 1}}]}'
            ),
            "defined twice",
        ),
        ("{}", "missing 'type'"),
        ('{"type": {"type": "int"}}', r"'type' must be a type name at \$\.type"),
        ('{"type": ["null", "int"]}', r"'type' must be a type name at \$\.type"),
        (
            (
                '{"type": "record", "name": "R", "fields": [{"name": "a", "type": "int", '
                '"aliases": 5}]}'
            ),
            r"aliases must be a list at \$<R>\.a",
        ),
        (
            (
                '{"type": "record", "name": "R", "fields": [{"name": "a", "type": "int", '
                '"aliases": "xy"}]}'
            ),
            r"aliases must be a list at \$<R>\.a",
        ),
        (
            (
                '{"type": "record", "name": "R", "fields": [{"name": "a", "type": "int", '
                '"order": "bogus"}]}'
            ),
            r"order must be ascending, descending or ignore at \$<R>\.a",
        ),
        (
            '{"type": "record", "name": "R", "namespace": "1x", "fields": []}',
            r"invalid namespace '1x' at \$",
        ),
        (
            '{"type": "record", "name": "R", "namespace": "com..x", "fields": []}',
            r"invalid namespace 'com\.\.x' at \$",
        ),
        ('{"type": "fixed", "name": "int", "size": 4}', "'int' is a primitive type's name"),
        (
            (
                '{"type": "record", "name": "R", "fields": [{"name": "c", "type": {"type": '
                '"enum", "name": "Color", "symbols": ["A"]}}, {"name": "i", "type": {"type": '
                '"record", "name": "Inner", "namespace": "com.x", "fields": [{"name": "cc", '
                '"type": "Color"}]}}]}'
            ),
            r"unknown type 'com.x.Color' at \$<R>\.i<com\.x\.Inner>\.cc: 'Color' of no namespace",
        ),
        (
            (
                '{"type": "record", "name": "R", "fields": [{"name": "a", "type": '
                '{"type": "enum", "name": "long", "symbols": ["A"]}}]}'
            ),
            r"'long' is a primitive type's name at \$<R>\.a",
        ),
    ],
)
def test_invalid_schemas_are_refused_with_a_reason(text: str, reason: str) -> None:
    """Every malformed schema raises InvalidSchema naming what is wrong."""
    with pytest.raises(InvalidSchema, match=reason):
        parse(text)
