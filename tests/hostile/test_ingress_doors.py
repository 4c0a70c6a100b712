"""Hostile requests against a running ingress (uvicorn, httptools, real SQLite/PostgreSQL)."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from pathlib import Path
from urllib.parse import urlencode

import httpx
import pytest
from hostile.ingress_server import raw_request, running_ingress, status_of
from ingress.signing import hub_signature, standard_headers, stripe_signature

from pipeline.config import IngressSlotSettings
from pipeline.logstore import Selection

SECRET = "hostile-secret"  # noqa: S105 - a test secret
WHSEC = "whsec_aG9zdGlsZS1zdGFuZGFyZC1rZXk="
PLAIN = {"plain": {"scheme": "none", "tenant": {"pointer": "/tenant"}}}
GITHUB = {
    "github": {
        "scheme": "github",
        "secrets": [SECRET],
        "tenant": {"pointer": "/repository/owner/login"},
    }
}


def _idle_head(port: int) -> bytes:
    return (
        f"POST /hooks/github HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        "Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{"
    ).encode()


async def test_idle_bodies_do_not_hold_the_admission_slots(tmp_path: Path) -> None:
    """Sockets that sent headers and one body byte leave every slot to a valid signed request."""
    admission = IngressSlotSettings(max_in_flight=2, queue_timeout_ms=100)
    async with running_ingress(tmp_path, GITHUB, admission=admission) as ingress:
        idle = [await asyncio.open_connection("127.0.0.1", ingress.port) for _ in range(6)]
        for _, writer in idle:
            writer.write(_idle_head(ingress.port))
            await writer.drain()
        body = json.dumps({"repository": {"owner": {"login": "octo"}}}).encode()
        headers = {"x-hub-signature-256": hub_signature(SECRET, body)}
        async with httpx.AsyncClient(base_url=ingress.url) as http:
            # Served after the idle sockets' requests started (connections are served in order).
            assert (await http.get("/hooks/nowhere")).status_code == 404
            answer = await http.post("/hooks/github", content=body, headers=headers)
        for _, writer in idle:
            writer.close()
    assert answer.status_code == 200, answer.text


async def test_a_body_that_never_arrives_is_answered_408(tmp_path: Path) -> None:
    """A request whose body stalls gets 408 once the body timeout passes, and the socket closes."""
    async with running_ingress(tmp_path, GITHUB, body_timeout_s=0.2) as ingress:
        reader, writer = await asyncio.open_connection("127.0.0.1", ingress.port)
        writer.write(_idle_head(ingress.port))
        await writer.drain()
        async with asyncio.timeout(10):
            answer = await reader.read()  # until the server closes
        writer.close()
    assert status_of(answer) == 408
    assert ingress.built.app.counters["github", "body_timeout"] == 1


async def test_a_client_gone_mid_body_stores_nothing(tmp_path: Path) -> None:
    """An unsigned source never stores the truncated body of a client that disconnected."""
    async with running_ingress(tmp_path, PLAIN) as ingress:
        head = (
            f"POST /hooks/plain HTTP/1.1\r\nHost: 127.0.0.1:{ingress.port}\r\n"
            "Content-Length: 100\r\n\r\n"
        ).encode()
        _, writer = await asyncio.open_connection("127.0.0.1", ingress.port)
        writer.write(head + b'{"tenant": "cut"}')
        await writer.drain()
        writer.close()
        await writer.wait_closed()
        async with httpx.AsyncClient(base_url=ingress.url) as http:
            whole = await http.post("/hooks/plain", content=b'{"tenant": "whole"}')
        counts = await ingress.built.store.count_by_state(Selection())
    assert whole.status_code == 200
    assert sum(counts.values()) == 1


async def test_an_oversized_request_head_is_answered_431(tmp_path: Path) -> None:
    """A header past ``max_head_bytes`` gets 431 and a closed connection, not a 401 later."""
    async with running_ingress(tmp_path, GITHUB, max_head_bytes=4096) as ingress:
        head = (
            f"POST /hooks/github HTTP/1.1\r\nHost: 127.0.0.1:{ingress.port}\r\n"
            f"X-Padding: {'a' * 16_384}\r\nContent-Length: 2\r\n\r\n"
        ).encode()
        answer = await raw_request(ingress.port, head, b"{}")
    assert status_of(answer) == 431


async def test_a_huge_signature_header_is_refused_before_any_hmac(tmp_path: Path) -> None:
    """A 40 KB ``webhook-signature`` of many ``v1`` candidates is refused as too large (401)."""
    sources = {"clerk": {"scheme": "standard_webhooks", "secrets": [WHSEC]}}
    body = b'{"type": "user.created"}'
    now = int(time.time())
    headers = standard_headers(WHSEC, "msg_1", now, body)
    headers["webhook-signature"] = " ".join(["v1,AAAA"] * 5_000)
    async with (
        running_ingress(tmp_path, sources) as ingress,
        httpx.AsyncClient(base_url=ingress.url) as http,
    ):
        answer = await http.post("/hooks/clerk", content=body, headers=headers)
    assert answer.status_code == 401
    assert ingress.built.app.counters["clerk", "rejected:signature header too large"] == 1


@pytest.mark.parametrize(
    ("timestamp", "reason"),
    [("²", "malformed signature header"), ("9" * 5_000, "signature header too large")],
)
async def test_a_timestamp_of_odd_digits_is_a_malformed_header(
    tmp_path: Path, timestamp: str, reason: str
) -> None:
    """``²`` or 5,000 digits in Stripe's ``t=`` is refused by reason, not a verifier crash."""
    sources = {"stripe": {"scheme": "stripe", "secrets": [SECRET]}}
    body = b'{"id": "evt_1"}'
    signature = stripe_signature(SECRET, body, 1).replace("t=1", f"t={timestamp}")
    async with (
        running_ingress(tmp_path, sources) as ingress,
        httpx.AsyncClient(base_url=ingress.url) as http,
    ):
        answer = await http.post(
            "/hooks/stripe",
            content=body,
            headers={"stripe-signature": signature.encode("latin-1")},
        )
    assert answer.status_code == 401
    assert ingress.built.app.counters["stripe", f"rejected:{reason}"] == 1
    assert ingress.built.app.counters["stripe", "rejected:verifier error"] == 0


@pytest.mark.parametrize("log_store", ["sqlite", "postgres"])
@pytest.mark.parametrize("bad", ["\ud800", "nul\x00byte", "x" * 5_000])
async def test_one_bad_value_never_fails_its_neighbours(
    tmp_path: Path, request: pytest.FixtureRequest, log_store: str, bad: str
) -> None:
    """A tenant with a lone surrogate, a NUL or 5,000 characters is 400; its neighbours 200."""
    if log_store == "postgres":
        request.getfixturevalue("postgres_service")
    bodies = [json.dumps({"tenant": f"good-{n}"}).encode() for n in range(3)]
    bodies.insert(1, json.dumps({"tenant": bad}).encode())
    async with (
        running_ingress(tmp_path, PLAIN, log_store=log_store) as ingress,
        httpx.AsyncClient(base_url=ingress.url) as http,
    ):
        answers = await asyncio.gather(
            *(http.post("/hooks/plain", content=body) for body in bodies)
        )
        counts = await ingress.built.store.count_by_state(Selection())
    assert [a.status_code for a in answers] == [200, 400, 200, 200]
    assert sum(counts.values()) == 3


async def test_an_unsigned_delivery_id_does_not_defeat_dedupe(tmp_path: Path) -> None:
    """One captured GitHub body replayed under new ``X-GitHub-Delivery`` ids is stored once."""
    body = json.dumps({"repository": {"owner": {"login": "octo"}}}).encode()
    signature = hub_signature(SECRET, body)
    async with (
        running_ingress(tmp_path, GITHUB) as ingress,
        httpx.AsyncClient(base_url=ingress.url) as http,
    ):
        answers = [
            await http.post(
                "/hooks/github",
                content=body,
                headers={"x-hub-signature-256": signature, "x-github-delivery": f"d-{n}"},
            )
            for n in range(3)
        ]
        counts = await ingress.built.store.count_by_state(Selection())
    assert [a.json()["status"] for a in answers] == ["accepted", "duplicate", "duplicate"]
    assert sum(counts.values()) == 1


async def test_tenant_or_event_id_from_an_unsigned_header_warns_at_start(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A signed source reading tenant and event id from unsigned headers is warned about."""
    partner = {
        "partner": {
            "scheme": "hmac",
            "secrets": [SECRET],
            "hmac": {"header": "X-Partner-Signature"},
            "event_id": {"header": "X-Partner-Delivery"},
            "tenant": {"header": "X-Partner-Account"},
        }
    }
    with caplog.at_level(logging.WARNING, logger="pipeline.ingress.source"):
        async with running_ingress(tmp_path, partner):
            pass
    text = caplog.text
    assert "tenant comes from the unsigned header x-partner-account" in text
    assert "event_id comes from the unsigned header x-partner-delivery" in text


async def test_svix_headers_alone_give_the_event_id(tmp_path: Path) -> None:
    """A Clerk delivery with only ``svix-*`` headers is accepted, keyed by its ``svix-id``."""
    sources = {"clerk": {"scheme": "standard_webhooks", "secrets": [WHSEC]}}
    body = b'{"type": "user.created", "data": {"id": "user_1"}}'
    signed = standard_headers(WHSEC, "msg_svix", int(time.time()), body)
    headers = {name.replace("webhook-", "svix-"): value for name, value in signed.items()}
    async with (
        running_ingress(tmp_path, sources) as ingress,
        httpx.AsyncClient(base_url=ingress.url) as http,
    ):
        answer = await http.post("/hooks/clerk", content=body, headers=headers)
        row = await ingress.built.store.get(answer.json().get("id", ""))
    assert answer.status_code == 200, answer.text
    assert row is not None
    assert row.event_id == "msg_svix"


async def test_a_whatsapp_status_without_a_message_id_is_accepted(tmp_path: Path) -> None:
    """A signed delivery receipt (``statuses[]``, no ``messages[]``) is not refused with 400."""
    sources = {
        "whatsapp": {
            "scheme": "meta",
            "secrets": [SECRET],
            "tenant": {"pointer": "/entry/0/id"},
            "event_id": {"pointer": "/entry/0/changes/0/value/messages/0/id"},
        }
    }
    change = {"field": "messages", "value": {"statuses": [{"id": "w.1", "status": "read"}]}}
    body = json.dumps({"entry": [{"id": "biz", "changes": [change]}]}).encode()
    signature = {"x-hub-signature-256": hub_signature(SECRET, body)}
    async with (
        running_ingress(tmp_path, sources) as ingress,
        httpx.AsyncClient(base_url=ingress.url) as http,
    ):
        answer = await http.post("/hooks/whatsapp", content=body, headers=signature)
    assert answer.status_code == 200, answer.text


async def test_a_form_encoded_github_delivery_is_read(tmp_path: Path) -> None:
    """GitHub's ``application/x-www-form-urlencoded`` option (``payload=<json>``) is accepted."""
    payload = json.dumps({"repository": {"owner": {"login": "octo"}}})
    body = urlencode({"payload": payload}).encode()
    headers = {
        "content-type": "application/x-www-form-urlencoded",
        "x-hub-signature-256": hub_signature(SECRET, body),
    }
    async with (
        running_ingress(tmp_path, GITHUB) as ingress,
        httpx.AsyncClient(base_url=ingress.url) as http,
    ):
        answer = await http.post("/hooks/github", content=body, headers=headers)
        row = await ingress.built.store.get(answer.json().get("id", ""))
    assert answer.status_code == 200, answer.text
    assert row is not None
    assert row.tenant == "octo"


async def test_deeply_nested_json_is_a_400(tmp_path: Path) -> None:
    """A body nested 100,000 levels deep is answered 400, not a 500 with a traceback."""
    body = b"[" * 100_000 + b"]" * 100_000
    async with (
        running_ingress(tmp_path, PLAIN) as ingress,
        httpx.AsyncClient(base_url=ingress.url) as http,
    ):
        answer = await http.post("/hooks/plain", content=body)
    assert (answer.status_code, answer.json()) == (400, {"error": "body is nested too deeply"})
