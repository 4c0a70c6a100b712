"""Bodies nested too deep for ``json`` at every door of a real ingress: a 400, never a 500.

``json.loads`` of ``[[[...]]]`` nested 100,000 deep raises ``RecursionError``, no
``ValueError``. A body just shallow enough for the parser can still hold a tenant, key or event
id whose value is nested so deep that writing it back as compact JSON (an id of an object or
array value) raises it, a few frames further down the same stack.
"""

from __future__ import annotations

import sys
from pathlib import Path
from urllib.parse import urlencode

import httpx
from hostile.ingress_server import running_ingress
from ingress.signing import hub_signature

DEEP = b"[" * 100_000 + b"]" * 100_000
"""A body of 200 kB nested past any recursion limit."""
SECRET = "hostile-deep-secret"  # noqa: S105 - a test secret
SIGNED = {"github": {"scheme": "github", "secrets": [SECRET], "tenant": {"pointer": "/org"}}}
FIELDS = {
    "fields": {
        "scheme": "none",
        "tenant": {"pointer": "/tenant"},
        "key": {"pointer": "/key"},
        "event_id": {"pointer": "/id"},
    }
}
NESTED = {"error": "body is nested too deeply"}


async def test_a_deep_body_is_a_400_through_every_source_kind(tmp_path: Path) -> None:
    """Plain JSON, form-encoded ``payload`` and a signed delivery: 400 ``nested too deeply``."""
    form = urlencode({"payload": DEEP.decode()}).encode()
    sources = {**SIGNED, **FIELDS}
    async with (
        running_ingress(tmp_path, sources) as ingress,
        httpx.AsyncClient(base_url=ingress.url, timeout=30) as http,
    ):
        plain = await http.post("/hooks/fields", content=DEEP)
        as_form = await http.post(
            "/hooks/fields",
            content=form,
            headers={"content-type": "application/x-www-form-urlencoded"},
        )
        signed = await http.post(
            "/hooks/github",
            content=DEEP,
            headers={
                "x-hub-signature-256": hub_signature(SECRET, DEEP),
                "x-github-event": "push",
                "x-github-delivery": "d-1",
                "content-type": "application/json",
            },
        )
        signed_form = await http.post(
            "/hooks/github",
            content=form,
            headers={
                "x-hub-signature-256": hub_signature(SECRET, form),
                "content-type": "application/x-www-form-urlencoded",
            },
        )
        unsigned = await http.post(
            "/hooks/github", content=DEEP, headers={"x-hub-signature-256": "sha256=00"}
        )
    assert (plain.status_code, plain.json()) == (400, NESTED)
    assert (as_form.status_code, as_form.json()) == (400, NESTED)
    assert (signed.status_code, signed.json()) == (400, NESTED)
    assert (signed_form.status_code, signed_form.json()) == (400, NESTED)
    assert unsigned.status_code == 401  # the signature is checked before the body is read


async def test_a_field_nested_near_the_parser_limit_is_a_400(tmp_path: Path) -> None:
    """Tenant, key or event id objects at every depth around the limit: 200 or 400, no 500.

    The parser reads the body at some depth the test cannot know (it depends on the server's
    stack), so every depth up to past the recursion limit is sent; each such value that is read
    becomes an id as compact JSON, which at the deepest the parser read raised
    ``RecursionError``, a 500 with a traceback.
    """
    limit = sys.getrecursionlimit()
    answers: dict[str, set[int]] = {"tenant": set(), "key": set(), "id": set()}
    async with (
        running_ingress(tmp_path, FIELDS) as ingress,
        httpx.AsyncClient(base_url=ingress.url, timeout=30) as http,
    ):
        for field, seen in answers.items():
            for depth in range(limit // 2, limit + 20):
                value = "[" * depth + "]" * depth
                body = f'{{"tenant":"t","key":"k","id":"i{depth}","{field}":{value}}}'
                answer = await http.post("/hooks/fields", content=body.encode())
                seen.add(answer.status_code)
                if answer.status_code == 400:
                    assert answer.json()["error"] in (
                        "body is nested too deeply",
                        f"{field if field != 'id' else 'event id'} too long",
                    ), answer.text
    assert answers == {"tenant": {200, 400}, "key": {200, 400}, "id": {200, 400}}
