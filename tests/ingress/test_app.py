"""The ASGI app: order of work per request, dedupe, handshake, 413/401/400 and 503 shedding."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from ingress.helpers import META, build, client, meta_body
from ingress.signing import hub_signature

from pipeline.config import IngressSlotSettings
from pipeline.logstore import NewRow, RowState, Selection
from pipeline.logstore.sqlite import SqliteLogStore

TOPICS = {"messages": "messages", "engagement": "engagement"}
SECRET = "meta-app-secret"  # noqa: S105 - a test secret


def signed(body: bytes, secret: str = SECRET) -> dict[str, str]:
    """Headers of a Meta delivery of ``body``."""
    return {"x-hub-signature-256": hub_signature(secret, body), "content-type": "application/json"}


async def test_accepted_webhook_is_stored_with_what_was_extracted(
    tmp_path: Path, sqlite_store: SqliteLogStore
) -> None:
    """A verified POST is answered 200 with the row id, and the row holds the raw request."""
    _, http = client(build(tmp_path, {"whatsapp": META}, TOPICS), sqlite_store)
    body = meta_body(1)
    async with http:
        response = await http.post("/hooks/whatsapp", content=body, headers=signed(body))
    assert response.status_code == 200
    assert response.json()["status"] == "accepted"
    row = await sqlite_store.get(response.json()["id"])
    assert row is not None
    assert row.body == body
    assert (row.source, row.tenant, row.key, row.event_id) == (
        "whatsapp",
        "biz-1",
        "wa-1",
        "wamid.1",
    )
    assert (row.topic, row.lane, row.state) == ("messages", "messages", RowState.RECEIVED)
    assert row.headers["x-hub-signature-256"] == hub_signature(SECRET, body)


async def test_lane_is_chosen_from_the_payload(
    tmp_path: Path, sqlite_store: SqliteLogStore
) -> None:
    """A comment change goes to the engagement lane; anything else to the default."""
    _, http = client(build(tmp_path, {"whatsapp": META}, TOPICS), sqlite_store)
    async with http:
        for n, field in enumerate(["comments", "messages", "statuses"]):
            body = meta_body(n, field)
            assert (
                await http.post("/hooks/whatsapp", content=body, headers=signed(body))
            ).is_success
    rows = await sqlite_store.select(Selection(), limit=10)
    assert [r.topic for r in rows] == ["engagement", "messages", "messages"]


async def test_redelivery_answers_200_and_stores_nothing_new(
    tmp_path: Path, sqlite_store: SqliteLogStore
) -> None:
    """The provider's redelivery of an event id is a 200 duplicate, and one row remains."""
    app, http = client(build(tmp_path, {"whatsapp": META}, TOPICS), sqlite_store)
    body = meta_body(7)
    async with http:
        first = await http.post("/hooks/whatsapp", content=body, headers=signed(body))
        again = await http.post("/hooks/whatsapp", content=body, headers=signed(body))
    assert first.json()["status"] == "accepted"
    assert (again.status_code, again.json()) == (200, {"status": "duplicate"})
    assert await sqlite_store.count_by_state(Selection()) == {RowState.RECEIVED: 1}
    assert app.counters["whatsapp", "duplicate"] == 1


async def test_source_without_event_id_dedupes_on_the_body(
    tmp_path: Path, sqlite_store: SqliteLogStore
) -> None:
    """Without an event id, an identical body is the same event; a different body is not."""
    plain = {"scheme": "meta", "secrets": [SECRET], "topic": "messages"}
    _, http = client(build(tmp_path, {"plain": plain}, TOPICS), sqlite_store)
    async with http:
        for body in (b"one", b"one", b"two"):
            assert (await http.post("/hooks/plain", content=body, headers=signed(body))).is_success
    assert await sqlite_store.count_by_state(Selection()) == {RowState.RECEIVED: 2}


@pytest.mark.parametrize(
    ("headers", "reason"),
    [
        (signed(b"other body"), "signature mismatch"),
        (signed(meta_body(1), "wrong-secret"), "signature mismatch"),
        ({}, "missing signature header"),
        ({"x-hub-signature-256": "md5=abc"}, "malformed signature header"),
    ],
    ids=["tampered", "wrong-secret", "missing", "malformed"],
)
async def test_unverified_request_is_401_counted_and_not_stored(
    tmp_path: Path, sqlite_store: SqliteLogStore, headers: dict[str, str], reason: str
) -> None:
    """A failed verification answers 401, counts the reason, and stores nothing."""
    app, http = client(build(tmp_path, {"whatsapp": META}, TOPICS), sqlite_store)
    async with http:
        response = await http.post("/hooks/whatsapp", content=meta_body(1), headers=headers)
    assert response.status_code == 401
    assert app.counters["whatsapp", f"rejected:{reason}"] == 1
    assert await sqlite_store.count_by_state(Selection()) == {}


async def test_oversized_body_is_413_declared_or_streamed(
    tmp_path: Path, sqlite_store: SqliteLogStore
) -> None:
    """A body over the cap is refused by Content-Length, and when streamed without one."""
    capped = {**META, "max_body_bytes": 1_024}
    app, http = client(build(tmp_path, {"whatsapp": capped}, TOPICS), sqlite_store)
    big = meta_body(1, size=4_096)

    async def chunks() -> AsyncIterator[bytes]:
        for start in range(0, len(big), 500):
            yield big[start : start + 500]

    async with http:
        declared = await http.post("/hooks/whatsapp", content=big, headers=signed(big))
        streamed = await http.post("/hooks/whatsapp", content=chunks(), headers=signed(big))
        fits = meta_body(2)
        ok = await http.post("/hooks/whatsapp", content=fits, headers=signed(fits))
    assert (declared.status_code, streamed.status_code, ok.status_code) == (413, 413, 200)
    assert app.counters["whatsapp", "too_large"] == 2


async def test_non_json_body_is_400_after_verification(
    tmp_path: Path, sqlite_store: SqliteLogStore
) -> None:
    """A signed body that is not JSON cannot be routed: 400, nothing stored."""
    _, http = client(build(tmp_path, {"whatsapp": META}, TOPICS), sqlite_store)
    body = b"<xml>not json</xml>"
    async with http:
        response = await http.post("/hooks/whatsapp", content=body, headers=signed(body))
    assert (response.status_code, response.json()) == (400, {"error": "body is not JSON"})
    assert await sqlite_store.count_by_state(Selection()) == {}


async def test_missing_event_id_dedupes_on_the_body_hash(
    tmp_path: Path, sqlite_store: SqliteLogStore
) -> None:
    """A signed body without the configured event id is accepted once, keyed by its SHA-256."""
    _, http = client(build(tmp_path, {"whatsapp": META}, TOPICS), sqlite_store)
    missing_id = json.dumps({"entry": [{"id": "biz"}]}).encode()
    async with http:
        first = await http.post("/hooks/whatsapp", content=missing_id, headers=signed(missing_id))
        again = await http.post("/hooks/whatsapp", content=missing_id, headers=signed(missing_id))
    assert (first.status_code, again.json()) == (200, {"status": "duplicate"})
    row = await sqlite_store.get(first.json()["id"])
    assert row is not None
    assert row.event_id.startswith("sha256:")


@pytest.mark.parametrize(
    ("params", "status"),
    [
        (
            {
                "hub.mode": "subscribe",
                "hub.verify_token": "let-me-in",
                "hub.challenge": "1158201444",
            },
            200,
        ),
        ({"hub.mode": "subscribe", "hub.verify_token": "guess", "hub.challenge": "1"}, 403),
        ({"hub.mode": "unsubscribe", "hub.verify_token": "let-me-in", "hub.challenge": "1"}, 403),
        ({"hub.mode": "subscribe", "hub.verify_token": "let-me-in"}, 403),
    ],
    ids=["match", "wrong-token", "wrong-mode", "no-challenge"],
)
async def test_meta_subscription_handshake(
    tmp_path: Path, sqlite_store: SqliteLogStore, params: dict[str, str], status: int
) -> None:
    """GET echoes hub.challenge as text only for subscribe with the matching verify token."""
    _, http = client(build(tmp_path, {"whatsapp": META}, TOPICS), sqlite_store)
    async with http:
        response = await http.get("/hooks/whatsapp", params=params)
    assert response.status_code == status
    if status == 200:
        assert response.text == "1158201444"
        assert response.headers["content-type"] == "text/plain"


async def test_handshake_is_refused_without_a_configured_token(
    tmp_path: Path, sqlite_store: SqliteLogStore
) -> None:
    """A source with no verify_token never answers a challenge."""
    no_token = {k: v for k, v in META.items() if k != "verify_token"}
    _, http = client(build(tmp_path, {"whatsapp": no_token}, TOPICS), sqlite_store)
    params = {"hub.mode": "subscribe", "hub.verify_token": "", "hub.challenge": "1"}
    async with http:
        assert (await http.get("/hooks/whatsapp", params=params)).status_code == 403


async def test_unknown_source_and_method(tmp_path: Path, sqlite_store: SqliteLogStore) -> None:
    """An unknown source is 404 and another method 405."""
    _, http = client(build(tmp_path, {"whatsapp": META}, TOPICS), sqlite_store)
    async with http:
        assert (await http.post("/hooks/nope", content=b"{}")).status_code == 404
        assert (await http.post("/elsewhere", content=b"{}")).status_code == 404
        assert (await http.put("/hooks/whatsapp", content=b"{}")).status_code == 405


class GatedStore:
    """A real store whose inserts wait for a gate, as when the disk cannot keep up."""

    def __init__(self, store: SqliteLogStore) -> None:
        """Wrap ``store`` with a closed gate."""
        self.store = store
        self.gate = asyncio.Event()
        self.waiting = 0

    async def insert(self, row: NewRow) -> bool:
        """Wait for the gate, then insert."""
        self.waiting += 1
        await self.gate.wait()
        return await self.store.insert(row)

    async def mark_produced(self, ids: list[str]) -> None:
        """Delegate."""
        await self.store.mark_produced(ids)

    async def record_failure(self, ids: list[str], error: str) -> None:
        """Delegate."""
        await self.store.record_failure(ids, error)


async def test_overload_is_shed_with_503_and_retry_after(
    tmp_path: Path, sqlite_store: SqliteLogStore
) -> None:
    """Past the in-flight bound, requests get 503 with Retry-After; admitted ones complete."""
    limits = IngressSlotSettings(max_in_flight=2, queue_timeout_ms=0, max_retry_after_s=30)
    gated = GatedStore(sqlite_store)
    app, http = client(build(tmp_path, {"whatsapp": META}, TOPICS, limits), gated)
    bodies = [meta_body(n) for n in range(2)]
    async with http:
        admitted = [
            asyncio.create_task(http.post("/hooks/whatsapp", content=b, headers=signed(b)))
            for b in bodies
        ]
        deadline = asyncio.get_running_loop().time() + 10
        while gated.waiting < 2:
            assert asyncio.get_running_loop().time() < deadline
            await asyncio.sleep(0.01)
        extra = meta_body(9)
        shed = await http.post("/hooks/whatsapp", content=extra, headers=signed(extra))
        gated.gate.set()
        answers = await asyncio.gather(*admitted)
    assert shed.status_code == 503
    assert 1 <= int(shed.headers["retry-after"]) <= 30
    assert [a.status_code for a in answers] == [200, 200]
    assert app.counters["whatsapp", "shed"] == 1
    assert await sqlite_store.count_by_state(Selection()) == {RowState.RECEIVED: 2}


async def test_a_failing_log_store_answers_503(tmp_path: Path) -> None:
    """When the row cannot be made durable the answer is 503, never 200."""
    store = SqliteLogStore(tmp_path / "closed.db")  # never opened: every insert fails
    _, http = client(build(tmp_path, {"whatsapp": META}, TOPICS), store)
    body = meta_body(1)
    async with http:
        response = await http.post("/hooks/whatsapp", content=body, headers=signed(body))
    assert response.status_code == 503
    assert "retry-after" in response.headers


async def test_a_failing_log_store_is_one_line_naming_why(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A store outage logs what failed and why on one line, not a traceback per webhook."""
    store = SqliteLogStore(tmp_path / "closed.db")  # never opened: every insert fails
    _, http = client(build(tmp_path, {"whatsapp": META}, TOPICS), store)
    body = meta_body(1)
    caplog.set_level(logging.ERROR, logger="pipeline.ingress.app")
    async with http:
        response = await http.post("/hooks/whatsapp", content=body, headers=signed(body))
    assert response.status_code == 503
    (record,) = [r for r in caplog.records if "log store insert failed" in r.getMessage()]
    assert record.exc_info is None
    assert record.getMessage().startswith("log store insert failed on source whatsapp: ")
    assert len(record.getMessage()) > len("log store insert failed on source whatsapp: ")
