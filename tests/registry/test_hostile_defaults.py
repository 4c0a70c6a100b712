"""Field defaults built to make their check explode answer promptly, on both stores.

A union default may match any branch (Avro's Java rule), so a default nested through a
recursive union was tried branch by branch at every level: a branch failing only at the
bottom made the check double per level (30 levels, a 1 KiB schema, never answered and kept a
worker thread busy for good). A union of thousands of record branches against an array
default of tens of thousands of objects tried every branch for every item (hundreds of
millions of steps in one request). The tests assert answers, never time; a check that does
not end fails on the suite's timeout.
"""

from __future__ import annotations

import json

import httpx
import pytest

from pipeline.registry.canonical import MAX_DEFAULT_STEPS

MEDIA_TYPE = "application/vnd.schemaregistry.v1+json"
PATHS = ("/subjects/s/versions", "/subjects/s", "/compatibility/subjects/s/versions")


def nested(depth: int, bottom: object) -> object:
    """``{"x": {"x": ... bottom}}``, ``depth`` objects deep."""
    value = bottom
    for _ in range(depth):
        value = {"x": value}
    return value


def recursive_union_schema(default: object) -> str:
    """Records A (fields x and y) and B (field x), x of type ``[null, A, B]`` in both.

    The top record's last field is ``[A, B]`` with ``default``: a value without ``y`` fails
    A only after its whole ``x`` has been checked, then B checks the same ``x`` again.
    """
    b = {"type": "record", "name": "B", "fields": [{"name": "x", "type": ["null", "A", "B"]}]}
    a_fields = [{"name": "x", "type": ["null", "A", b]}, {"name": "y", "type": "int"}]
    schema = {
        "type": "record",
        "name": "Top",
        "fields": [
            {"name": "a", "type": {"type": "record", "name": "A", "fields": a_fields}},
            {"name": "d", "type": ["A", "B"], "default": default},
        ],
    }
    return json.dumps(schema)


def post(url: str, schema_text: str) -> httpx.Response:
    """POST a body carrying ``schema_text``; the suite's timeout fails a check that hangs first."""
    body = json.dumps({"schema": schema_text}).encode()
    return httpx.post(url, content=body, headers={"Content-Type": MEDIA_TYPE}, timeout=600)


def test_a_valid_default_through_a_recursive_union_registers(registry_url: str) -> None:
    """40 levels where B matches every level: registered, looked up and tested as any schema."""
    schema = recursive_union_schema(nested(40, None))
    registered = post(f"{registry_url}/subjects/s/versions", schema)
    assert registered.json() == {"id": 1}, registered.text
    assert post(f"{registry_url}/subjects/s", schema).json()["version"] == 1
    tested = post(f"{registry_url}/compatibility/subjects/s/versions", schema)
    assert tested.json() == {"is_compatible": True}


@pytest.mark.parametrize("path", PATHS)
def test_an_invalid_default_through_a_recursive_union_answers_42201(
    registry_url: str, path: str
) -> None:
    """The same 40 levels over a number no branch takes: 422 naming the field, nothing stored."""
    answer = post(registry_url + path, recursive_union_schema(nested(40, 5)))
    assert (answer.status_code, answer.json()["error_code"]) == (422, 42201), answer.text
    assert "default of field 'd' in 'Top' does not match" in answer.json()["message"]
    assert httpx.get(f"{registry_url}/subjects").json() == []


def wide_union_schema(branches: int, items: int) -> str:
    """A union of ``branches`` records, each needing a field ``a``, and a map last.

    The array default holds ``items`` empty objects: each fails every record, then is a map.
    """
    records = [
        {"type": "record", "name": f"R{i}", "fields": [{"name": "a", "type": "int"}]}
        for i in range(branches)
    ]
    union = [*records, {"type": "map", "values": "int"}]
    field = {"name": "d", "type": {"type": "array", "items": union}, "default": [{}] * items}
    return json.dumps({"type": "record", "name": "Top", "fields": [field]})


@pytest.mark.parametrize("path", [p for p in PATHS if p != "/subjects/s"])
def test_a_default_too_costly_to_check_answers_42201(registry_url: str, path: str) -> None:
    """4000 branches times 60 000 items, within the body cap: refused with the step bound."""
    answer = post(registry_url + path, wide_union_schema(4000, 60_000))
    assert (answer.status_code, answer.json()["error_code"]) == (422, 42201), answer.text
    message = answer.json()["message"]
    assert "default of field 'd' in 'Top'" in message
    assert f"more than {MAX_DEFAULT_STEPS} steps" in message
    assert httpx.get(f"{registry_url}/subjects").json() == []


def test_a_lookup_of_a_default_too_costly_to_check_finds_nothing(registry_url: str) -> None:
    """A lookup compares fingerprints: past the step bound it stops checking and finds none."""
    answer = post(f"{registry_url}/subjects/s", wide_union_schema(4000, 60_000))
    assert (answer.status_code, answer.json()["error_code"]) == (404, 40401), answer.text
    assert httpx.get(f"{registry_url}/subjects").json() == []


def test_a_wide_union_default_within_the_bound_registers(registry_url: str) -> None:
    """The same shape at a size whose check stays under the bound is registered."""
    answer = post(f"{registry_url}/subjects/s/versions", wide_union_schema(100, 100))
    assert answer.json() == {"id": 1}, answer.text
