"""Hostile requests answer a 4xx naming the problem, never a 500, on both stores.

Each request here once reached a Python or database error (ValueError, OverflowError,
RecursionError, UnicodeEncodeError, psycopg's DataError) and came back as a 500 with a traceback
in the log. Confluent's answers are the reference: 40403 for an id that names nothing, 42201 for
a schema or body that cannot be read, 42202 for a bad version.
"""

from __future__ import annotations

import json
import random
import string
from collections.abc import Callable

import httpx
import pytest

from pipeline.registry.canonical import MAX_DEPTH, MAX_JSON_DEPTH, parse_json
from pipeline.registry.errors import InvalidSchema
from pipeline.registry.server.api import MAX_SUBJECT_BYTES

MEDIA_TYPE = "application/vnd.schemaregistry.v1+json"


def answer_of(response: httpx.Response) -> tuple[int, int]:
    """(HTTP status, Confluent error code) of an error answer."""
    return response.status_code, response.json()["error_code"]


ODD_IDS = {
    "superscript-two": "²",
    "arabic-indic-one": "\u0661",
    "past-2^64": "99999999999999999999",
    "2^31": "2147483648",
    "5000-digits": "9" * 5000,
    "5000-zeros": "0" * 5000,
}


@pytest.mark.parametrize("raw_id", ODD_IDS.values(), ids=ODD_IDS.keys())
@pytest.mark.parametrize("suffix", ["", "/schema", "/versions", "/subjects"])
def test_an_id_that_is_not_a_31_bit_number_is_not_found(
    registry_url: str, raw_id: str, suffix: str
) -> None:
    """Non-ASCII digits and ids past 2^31-1 answer 40403, as an id no schema has."""
    httpx.post(f"{registry_url}/subjects/held/versions", json={"schema": '"int"'})  # id 1 exists
    answer = httpx.get(f"{registry_url}/schemas/ids/{raw_id}{suffix}")
    assert answer_of(answer) == (404, 40403), answer.text


def post(url: str, body: bytes | str) -> httpx.Response:
    """POST raw bytes (or text) as the registry's media type."""
    content = body.encode() if isinstance(body, str) else body
    return httpx.post(url, content=content, headers={"Content-Type": MEDIA_TYPE}, timeout=60)


def schema_body(schema_text: str) -> str:
    """A registration body carrying ``schema_text`` as its ``schema`` string."""
    return json.dumps({"schema": schema_text})


def enum_with(extra: str) -> str:
    """An enum schema's JSON text with ``extra`` spliced in as one more attribute."""
    return '{"type": "enum", "name": "E", "symbols": ["A"], ' + extra + "}"


BAD_JSON = {
    "deep-body": "[" * 100_000,
    "deep-body-object": '{"a":' * 100_000,
    "5000-digit-number-in-body": '{"schema": "\\"int\\"", "n": ' + "1" * 5000 + "}",
    "nan-in-body": '{"schema": "\\"int\\"", "n": NaN}',
    "deep-schema": schema_body("[" * 100_000),
    "5000-digit-size": schema_body('{"type": "fixed", "name": "F", "size": ' + "1" * 5000 + "}"),
    "nan-property": schema_body(enum_with('"x": NaN')),
    "infinity-property": schema_body(enum_with('"x": Infinity')),
    "minus-infinity-property": schema_body(enum_with('"x": -Infinity')),
    "overflowing-float": schema_body(enum_with('"x": 1e400')),
    "nan-default": schema_body(
        '{"type": "record", "name": "R", "fields": [{"name": "d", "type": "double", '
        '"default": NaN}]}'
    ),
}


@pytest.mark.parametrize("body", BAD_JSON.values(), ids=BAD_JSON.keys())
@pytest.mark.parametrize(
    "path", ["/subjects/s/versions", "/subjects/s", "/compatibility/subjects/s/versions"]
)
def test_json_python_cannot_hold_or_confluent_refuses_answers_42201(
    registry_url: str, body: str, path: str
) -> None:
    """Unreadable JSON, in the body or in the schema string, is 422/42201; nothing is stored.

    Too deep for the parser, a number past the digit limit or a double's range, NaN/Infinity.
    """
    answer = post(registry_url + path, body)
    assert answer_of(answer) == (422, 42201), answer.text
    assert "JSON" in answer.json()["message"]
    assert httpx.get(f"{registry_url}/subjects").json() == []


@pytest.mark.parametrize("path", ["/config", "/mode", "/config/s", "/mode/s"])
def test_settings_bodies_too_deep_answer_42201(registry_url: str, path: str) -> None:
    """The settings endpoints read their bodies the same way."""
    answer = httpx.put(
        registry_url + path, content=b"[" * 100_000, headers={"Content-Type": MEDIA_TYPE}
    )
    assert answer_of(answer) == (422, 42201), answer.text


def test_a_schema_given_as_values_refuses_nan() -> None:
    """A schema built in Python (the serde's dict form) cannot carry NaN into its JSON text."""
    schema = {"type": "enum", "name": "E", "symbols": ["A"], "x": float("nan")}
    with pytest.raises(InvalidSchema, match="NaN"):
        parse_json(schema)


def record_with(field: str) -> str:
    """A record schema's JSON text with one field given as JSON text."""
    return '{"type": "record", "name": "R", "fields": [' + field + "]}"


# Escapes as the schema's JSON text carries them: json.dumps of the body keeps the backslash.
UNSTORABLE = {
    "surrogate-doc": enum_with('"doc": "\\ud800"'),
    "surrogate-symbol": '{"type": "enum", "name": "E", "symbols": ["A\\udfff"]}',
    "surrogate-default": record_with('{"name": "s", "type": "string", "default": "\\ud800x"}'),
    "surrogate-property-name": enum_with('"\\ud800": 1'),
    "nul-doc": enum_with('"doc": "a\\u0000b"'),
    "nul-symbol": '{"type": "enum", "name": "E", "symbols": ["A\\u0000"]}',
    "nul-default": record_with('{"name": "s", "type": "string", "default": "\\u0000"}'),
    "nul-property-name": enum_with('"x\\u0000": 1'),
}


@pytest.mark.parametrize("schema_text", UNSTORABLE.values(), ids=UNSTORABLE.keys())
def test_a_lone_surrogate_or_nul_in_the_schema_answers_42201(
    registry_url: str, schema_text: str
) -> None:
    """Text no UTF-8 column (surrogates) or PostgreSQL text (NUL) holds: 42201, never stored."""
    for path in ("/subjects/s/versions", "/subjects/s", "/compatibility/subjects/s/versions"):
        answer = post(registry_url + path, schema_body(schema_text))
        assert answer_of(answer) == (422, 42201), answer.text
    assert httpx.get(f"{registry_url}/subjects").json() == []


def test_a_surrogate_sent_raw_in_the_body_answers_42201(registry_url: str) -> None:
    """The body's own escape puts the lone surrogate straight into the schema string."""
    body = '{"schema": "{\\"type\\": \\"enum\\", \\"name\\": \\"E\\", \\"symbols\\": [\\"A\\"], '
    body += '\\"doc\\": \\"\\ud800\\"}"}'
    answer = post(f"{registry_url}/subjects/s/versions", body)
    assert answer_of(answer) == (422, 42201), answer.text


def nested_records(depth: int) -> str:
    """Records ``R1`` .. ``R<depth>``, each the type of the one field of the record above it.

    Written as text: json.dumps itself recurses too deep for the largest depths.
    """
    text = '{"type": "record", "name": "R1", "fields": []}'
    for level in range(2, depth + 1):
        text = (
            f'{{"type": "record", "name": "R{level}", "fields": [{{"name": "f", "type": {text}}}]}}'
        )
    return text


def nested_arrays(depth: int) -> str:
    """``depth`` arrays of arrays of int, as text."""
    return '{"type": "array", "items": ' * depth + '"int"' + "}" * depth


def test_nesting_up_to_the_cap_registers_and_is_checked(registry_url: str) -> None:
    """MAX_DEPTH levels of records register, evolve (checked both ways) and test as before."""
    versions = f"{registry_url}/subjects/deep/versions"
    httpx.put(f"{registry_url}/config/deep", json={"compatibility": "FULL"})
    first = post(versions, schema_body(nested_records(MAX_DEPTH)))
    assert first.status_code == 200, first.text
    evolved = json.loads(nested_records(MAX_DEPTH))
    evolved["fields"].append({"name": "extra", "type": "int", "default": 0})
    assert post(versions, schema_body(json.dumps(evolved))).status_code == 200
    test = post(f"{registry_url}/compatibility/subjects/deep/versions", schema_body('"int"'))
    assert test.json() == {"is_compatible": False}


@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 250, 330, 1000])
@pytest.mark.parametrize("build", [nested_records, nested_arrays], ids=["records", "arrays"])
def test_nesting_past_the_cap_answers_42201_and_spares_the_subject(
    registry_url: str, depth: int, build: Callable[[int], str]
) -> None:
    """Deeper schemas are refused with a reason; the subject's later checks still work.

    250 levels used to register and then make every later check on the subject recurse past
    Python's limit (500); 330 failed the first registration already.
    """
    versions = f"{registry_url}/subjects/deep/versions"
    assert post(versions, schema_body(nested_records(3))).status_code == 200
    for path in (
        "/subjects/deep/versions",
        "/subjects/deep",
        "/compatibility/subjects/deep/versions",
    ):
        answer = post(registry_url + path, schema_body(build(depth)))
        assert answer_of(answer) == (422, 42201), answer.text
        assert "nests deeper than" in answer.json()["message"]
    assert httpx.get(f"{versions}").json() == [1]
    assert post(versions, schema_body(nested_records(4))).status_code == 409


def test_deep_json_outside_the_types_is_capped(registry_url: str) -> None:
    """A property or default nested past the JSON cap is refused too.

    So a stored schema is always one the parser reads again, from however deep in a stack.
    """
    deep_value = "[" * (MAX_JSON_DEPTH + 1) + "]" * (MAX_JSON_DEPTH + 1)
    answer = post(
        f"{registry_url}/subjects/s/versions", schema_body(enum_with(f'"x": {deep_value}'))
    )
    assert answer_of(answer) == (422, 42201), answer.text
    assert "nests deeper than" in answer.json()["message"]


def fixed_schema(name: str) -> str:
    """A small distinct schema per name."""
    return json.dumps({"type": "fixed", "name": name, "size": 1})


@pytest.mark.parametrize(
    ("field", "value", "code"),
    [
        ("id", 2**70, 42201),
        ("id", 2**31, 42201),
        ("id", 10**999, 42201),
        ("version", 2**70, 42202),
        ("version", 2**31, 42202),
        ("version", 0, 42202),
        ("version", "7", 42202),
    ],
    ids=[
        "id-2^70",
        "id-2^31",
        "id-1000-digits",
        "version-2^70",
        "version-2^31",
        "version-0",
        "version-str",
    ],
)
def test_an_imported_id_or_version_past_2_31_answers_422(
    registry_url: str, field: str, value: object, code: int
) -> None:
    """IMPORT takes ids and versions up to 2^31-1, as Confluent's int fields do.

    2**70 used to reach the database: SQLite's integer binding overflowed and PostgreSQL's
    bigint was out of range, both a 500.
    """
    assert httpx.put(f"{registry_url}/mode/imp", json={"mode": "IMPORT"}).status_code == 200
    body = {"schema": fixed_schema("Big"), "id": 7, "version": 1, field: value}
    answer = post(f"{registry_url}/subjects/imp/versions", json.dumps(body))
    assert answer_of(answer) == (422, code), answer.text
    assert field in answer.json()["message"] or "version" in answer.json()["message"]
    assert httpx.get(f"{registry_url}/subjects").json() == []


def test_an_imported_id_and_version_of_2_31_minus_1_are_kept(registry_url: str) -> None:
    """The largest id and version are stored and read back on both stores."""
    top = 2**31 - 1
    httpx.put(f"{registry_url}/mode/imp", json={"mode": "IMPORT"})
    body = {"schema": fixed_schema("Top"), "id": top, "version": top}
    answer = post(f"{registry_url}/subjects/imp/versions", json.dumps(body))
    assert answer.json() == {"id": top}, answer.text
    assert httpx.get(f"{registry_url}/schemas/ids/{top}").status_code == 200
    assert httpx.get(f"{registry_url}/subjects/imp/versions/{top}").json()["id"] == top


CONTROL_SUBJECTS = {
    "nul": "a%00b",
    "soh": "a%01b",
    "newline": "a%0Ab",
    "unit-separator": "a%1Fb",
    "delete": "a%7Fb",
    "next-line-c1": "a%C2%85b",
}


@pytest.mark.parametrize("subject", CONTROL_SUBJECTS.values(), ids=CONTROL_SUBJECTS.keys())
def test_a_subject_with_a_control_character_is_not_created(registry_url: str, subject: str) -> None:
    """Registering under it, or giving it a level or a mode, answers Confluent's 42208.

    A NUL used to reach PostgreSQL, whose text cannot hold it: psycopg's DataError, a 500.
    """
    writes = [
        ("POST", f"/subjects/{subject}/versions", {"schema": '"int"'}),
        ("PUT", f"/config/{subject}", {"compatibility": "NONE"}),
        ("PUT", f"/mode/{subject}", {"mode": "READONLY"}),
    ]
    for method, path, body in writes:
        answer = httpx.request(method, registry_url + path, json=body)
        assert answer_of(answer) == (422, 42208), (path, answer.text)
    assert httpx.get(f"{registry_url}/subjects").json() == []
    assert httpx.get(f"{registry_url}/config/{subject}").json()["error_code"] == 40408


def nul_and_unknown(registry_url: str, method: str, path: str, body: object) -> list[dict]:
    """The answers to one request for ``a<NUL>b`` and for an unknown plain subject."""
    answers = []
    for subject in ("a%00b", "nobody"):
        answer = httpx.request(method, registry_url + path.format(s=subject), json=body)
        payload = answer.json()
        if isinstance(payload, dict) and "message" in payload:
            payload["message"] = payload["message"].replace("a\x00b", "nobody")
        answers.append({"status": answer.status_code, "body": payload})
    return answers


READS = [
    ("GET", "/subjects/{s}/versions", None),
    ("GET", "/subjects/{s}/versions/1", None),
    ("GET", "/subjects/{s}/versions/latest/schema", None),
    ("GET", "/subjects/{s}/versions/1/referencedby", None),
    ("GET", "/subjects/{s}/versions/abc", None),
    ("POST", "/subjects/{s}", {"schema": '"int"'}),
    ("DELETE", "/subjects/{s}", None),
    ("DELETE", "/subjects/{s}?permanent=true", None),
    ("DELETE", "/subjects/{s}/versions/1", None),
    ("DELETE", "/subjects/{s}/versions/1?permanent=true", None),
    ("POST", "/compatibility/subjects/{s}/versions", {"schema": '"int"'}),
    ("POST", "/compatibility/subjects/{s}/versions/latest", {"schema": '"int"'}),
    ("GET", "/config/{s}", None),
    ("GET", "/config/{s}?defaultToGlobal=true", None),
    ("DELETE", "/config/{s}", None),
    ("GET", "/mode/{s}", None),
    ("GET", "/mode/{s}?defaultToGlobal=true", None),
    ("DELETE", "/mode/{s}", None),
]


@pytest.mark.parametrize(("method", "path", "body"), READS, ids=[f"{m} {p}" for m, p, _ in READS])
def test_a_subject_with_nul_answers_as_one_that_does_not_exist(
    registry_url: str, method: str, path: str, body: object
) -> None:
    """Every other request naming it answers as for an unknown subject, on both stores."""
    httpx.post(f"{registry_url}/subjects/held/versions", json={"schema": '"int"'})
    with_nul, unknown = nul_and_unknown(registry_url, method, path, body)
    assert with_nul["status"] < 500
    assert with_nul == unknown


def random_subject(length: int, seed: int) -> str:
    """Letters that do not compress, so PostgreSQL indexes them at full length."""
    rng = random.Random(seed)
    return "".join(rng.choice(string.ascii_letters) for _ in range(length))


def test_a_subject_too_long_to_index_is_not_created(registry_url: str) -> None:
    """Over MAX_SUBJECT_BYTES: 42208 on both stores; PostgreSQL's btree refused it (500)."""
    long = random_subject(MAX_SUBJECT_BYTES + 1, seed=1)
    for method, path, body in [
        ("POST", f"/subjects/{long}/versions", {"schema": '"int"'}),
        ("PUT", f"/config/{long}", {"compatibility": "NONE"}),
        ("PUT", f"/mode/{long}", {"mode": "READONLY"}),
    ]:
        answer = httpx.request(method, registry_url + path, json=body)
        assert answer_of(answer) == (422, 42208), answer.text[:200]
        assert len(answer.json()["message"]) < 300
    assert httpx.get(f"{registry_url}/subjects/{long}/versions").json()["error_code"] == 40401
    longest = random_subject(MAX_SUBJECT_BYTES, seed=2)
    assert httpx.post(
        f"{registry_url}/subjects/{longest}/versions", json={"schema": '"int"'}
    ).json() == {"id": 1}
    assert (
        httpx.put(f"{registry_url}/config/{longest}", json={"compatibility": "NONE"}).status_code
        == 200
    )
    assert httpx.get(f"{registry_url}/subjects").json() == [longest]
