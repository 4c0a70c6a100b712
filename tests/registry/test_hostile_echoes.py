"""An error answer echoes at most a bounded part of what the client sent, on both stores.

A 400 000-character type name came back whole in a 400 KB message, a 16 000-character subject
and a 60 000-digit version likewise: every error message now keeps its beginning and its end
(the reason) and leaves out the middle past MAX_MESSAGE_CHARS.
"""

from __future__ import annotations

import json

import httpx
import pytest

from pipeline.registry.errors import MAX_MESSAGE_CHARS

LONG = 400_000
CASES = {
    "type-name": (
        "POST",
        "/subjects/s/versions",
        {"schema": json.dumps({"type": "fixed", "size": 1, "name": "a" * LONG + "-"})},
        (422, 42201),
        "invalid name",
    ),
    "unknown-type": (
        "POST",
        "/compatibility/subjects/s/versions",
        {"schema": json.dumps({"type": "array", "items": "a" * LONG})},
        (422, 42201),
        "unknown type",
    ),
    "subject": ("GET", "/subjects/" + "s" * 16_000 + "/versions", None, (404, 40401), "not found"),
    "version": (
        "GET",
        "/subjects/s/versions/" + "9" * 16_000,
        None,
        (422, 42202),
        "not a valid version id",
    ),
    "level": ("PUT", "/config", {"compatibility": "X" * LONG}, (422, 42203), "valid values"),
    "mode": ("PUT", "/mode", {"mode": "X" * LONG}, (422, 42204), "valid values"),
}


@pytest.mark.parametrize(
    ("method", "path", "body", "answer", "reason"), CASES.values(), ids=CASES.keys()
)
def test_a_long_echo_is_cut_in_the_middle(
    registry_url: str,
    method: str,
    path: str,
    body: object,
    answer: tuple[int, int],
    reason: str,
) -> None:
    """The answer keeps its code, its reason and both ends of the message, bounded."""
    got = httpx.request(method, registry_url + path, json=body, timeout=60)
    payload = got.json()
    assert (got.status_code, payload["error_code"]) == answer
    message = payload["message"]
    assert len(message) <= MAX_MESSAGE_CHARS + 60, len(message)
    assert reason in message
    assert "characters left out" in message


def test_a_short_message_is_unchanged(registry_url: str) -> None:
    """Messages within the bound are as before."""
    got = httpx.get(f"{registry_url}/subjects/nobody/versions")
    assert got.json() == {"error_code": 40401, "message": "Subject 'nobody' not found."}


def test_a_broken_rule_naming_a_long_field_is_cut_but_every_rule_is_kept(
    registry_url: str, unique: str
) -> None:
    """A 409 lists each broken rule; one echoing a 400 000-character field name is cut alone."""
    subject = f"wide-{unique}"

    def record(kind: str) -> dict[str, str]:
        fields = [{"name": "f" * LONG, "type": kind}, {"name": "n", "type": kind}]
        return {"schema": json.dumps({"type": "record", "name": "R", "fields": fields})}

    first = httpx.post(f"{registry_url}/subjects/{subject}/versions", json=record("int"))
    assert first.status_code == 200, first.text
    got = httpx.post(
        f"{registry_url}/subjects/{subject}/versions", json=record("string"), timeout=60
    )
    payload = got.json()
    assert (got.status_code, payload["error_code"]) == (409, 409)
    message = payload["message"]
    assert len(message) < 4 * MAX_MESSAGE_CHARS, len(message)
    assert "characters left out" in message
    assert "TYPE_MISMATCH at 'R.n' (/fields/1/type)" in message  # the short rule, whole
