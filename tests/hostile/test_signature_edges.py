"""Signatures under hostile senders, against a running ingress: what is verified is what is kept.

A compressed body is neither decompressed nor verified as its decompressed bytes (a bomb costs
what was sent); of repeated signature headers the last is verified, and it is the one the row
keeps; a replay inside the tolerance stores nothing more, and a timestamp outside it either way
is refused.
"""

from __future__ import annotations

import gzip
import json
import time
from pathlib import Path

import httpx
from hostile.ingress_server import raw_request, running_ingress, status_of
from ingress.signing import hub_signature, stripe_signature

from pipeline.logstore import Selection

HUB_SECRET = "edges-secret"  # noqa: S105 - a test secret
STRIPE_SECRET = "whsec_edges"  # noqa: S105 - a test secret
SOURCES = {
    "github": {
        "scheme": "github",
        "secrets": [HUB_SECRET],
        "tenant": {"pointer": "/repository/owner/login"},
    },
    "stripe": {"scheme": "stripe", "secrets": [STRIPE_SECRET], "tolerance_s": 300},
}


def _post(port: int, body: bytes, *headers: str) -> bytes:
    head = (
        f"POST /hooks/github HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        + "".join(f"{header}\r\n" for header in headers)
        + f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode()


async def test_a_compressed_body_is_verified_and_read_as_sent(tmp_path: Path) -> None:
    """A 48 KB gzip of 50 MB: signed as sent it is no JSON (400), signed inflated it is 401."""
    inflated = json.dumps({"repository": {"owner": {"login": "o" * 50_000_000}}}).encode()
    bomb = gzip.compress(inflated)
    async with running_ingress(tmp_path, SOURCES) as ingress:
        port = ingress.port
        as_sent = await raw_request(
            port,
            _post(
                port,
                bomb,
                "Content-Encoding: gzip",
                f"X-Hub-Signature-256: {hub_signature(HUB_SECRET, bomb)}",
            ),
            bomb,
        )
        as_inflated = await raw_request(
            port,
            _post(
                port,
                bomb,
                "Content-Encoding: gzip",
                f"X-Hub-Signature-256: {hub_signature(HUB_SECRET, inflated)}",
            ),
            bomb,
        )
        counters = ingress.built.app.counters
        stored = sum((await ingress.built.store.count_by_state(Selection())).values())
    assert (status_of(as_sent), status_of(as_inflated)) == (400, 401)
    assert counters["github", "malformed:body is not JSON"] == 1
    assert counters["github", "rejected:signature mismatch"] == 1
    assert stored == 0


async def test_of_repeated_signature_headers_the_last_is_verified_and_kept(
    tmp_path: Path,
) -> None:
    """A valid signature before a forged one is 401; after it, 200 and the row keeps it."""
    body = json.dumps({"repository": {"owner": {"login": "octo"}}}).encode()
    valid = hub_signature(HUB_SECRET, body)
    forged = "sha256=" + "0" * 64
    async with running_ingress(tmp_path, SOURCES) as ingress:
        port = ingress.port
        forged_last = await raw_request(
            port,
            _post(port, body, f"X-Hub-Signature-256: {valid}", f"X-Hub-Signature-256: {forged}"),
            body,
        )
        valid_last = await raw_request(
            port,
            _post(port, body, f"X-Hub-Signature-256: {forged}", f"X-Hub-Signature-256: {valid}"),
            body,
        )
        rows = await ingress.built.store.select(Selection(), limit=10)
    assert (status_of(forged_last), status_of(valid_last)) == (401, 200)
    assert [row.headers["x-hub-signature-256"] for row in rows] == [valid]


async def test_a_stripe_replay_stores_nothing_and_a_skewed_timestamp_is_refused(
    tmp_path: Path,
) -> None:
    """The same signature and timestamp again is a duplicate; ten minutes ahead or behind, 401."""
    body = json.dumps({"id": "evt_edges", "type": "charge.succeeded"}).encode()
    now = int(time.time())
    async with (
        running_ingress(tmp_path, SOURCES) as ingress,
        httpx.AsyncClient(base_url=ingress.url) as client,
    ):

        async def send(timestamp: int) -> httpx.Response:
            signature = stripe_signature(STRIPE_SECRET, body, timestamp)
            return await client.post(
                "/hooks/stripe", content=body, headers={"stripe-signature": signature}
            )

        first, replay = await send(now), await send(now)
        ahead, behind = await send(now + 600), await send(now - 600)
        stored = sum((await ingress.built.store.count_by_state(Selection())).values())
    assert (first.status_code, replay.json()) == (200, {"status": "duplicate"})
    assert (ahead.status_code, behind.status_code) == (401, 401)
    assert ingress.built.app.counters["stripe", "rejected:timestamp outside tolerance"] == 2
    assert stored == 1
