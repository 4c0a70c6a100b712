"""Repeated W3C trace context headers on one webhook, through the ingress's HTTP layer and ASGI.

Two ``traceparent`` headers are no valid context (the W3C test suite expects a new trace), and
repeated ``tracestate`` headers are one list, joined with ``,`` as HTTP combines a repeated
field. The server is the real one (:mod:`pipeline.ingress.http` under uvicorn, SQLite log, Redis
streams); the ASGI entry point is driven in process. What the log row keeps is what every
produce of the event carries (:func:`pipeline.ingress.headers.event_headers`).
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

from hostile.ingress_server import raw_request, running_ingress, status_of
from ingress.helpers import META, build, client, meta_body
from ingress.signing import hub_signature
from tracing.otlp_receiver import OtlpReceiver

from pipeline.ingress.headers import event_headers
from pipeline.logstore import LogRow
from pipeline.logstore.sqlite import SqliteLogStore

SECRET = "trace-headers-secret"  # noqa: S105 - a test secret
GITHUB = {
    "github": {
        "scheme": "github",
        "secrets": [SECRET],
        "tenant": {"pointer": "/repository/owner/login"},
    }
}
SPAN = "00f067aa0ba902b7"


async def _served(tmp_path: Path, extra: list[tuple[str, str]]) -> dict[str, bytes]:
    """The event headers of one signed webhook sent on a raw socket with ``extra`` headers."""
    body = json.dumps({"repository": {"owner": {"login": "acme"}}}).encode()
    lines = "".join(f"{name}: {value}\r\n" for name, value in extra)
    async with running_ingress(tmp_path, GITHUB) as ingress:
        head = (
            f"POST /hooks/github HTTP/1.1\r\nHost: 127.0.0.1:{ingress.port}\r\n"
            f"Content-Type: application/json\r\n"
            f"X-Hub-Signature-256: {hub_signature(SECRET, body)}\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n{lines}\r\n"
        )
        answer = await raw_request(ingress.port, head.encode(), body)
        assert status_of(answer) == 200, answer
        row_id = json.loads(answer.split(b"\r\n\r\n", 1)[1])["id"]
        row = await ingress.built.store.get(row_id)
    assert isinstance(row, LogRow)
    return event_headers(row)


def _trace_id(headers: dict[str, bytes]) -> str:
    return headers["traceparent"].decode().split("-")[1]


async def test_two_traceparent_headers_start_a_new_trace_at_the_http_layer(
    tmp_path: Path, traced: OtlpReceiver
) -> None:
    """Two ``traceparent`` headers on one request are no context: the event starts a new trace."""
    first, second = uuid.uuid4().hex, uuid.uuid4().hex
    got = await _served(
        tmp_path,
        [
            ("traceparent", f"00-{first}-{SPAN}-01"),
            ("traceparent", f"00-{second}-{SPAN}-01"),
            ("tracestate", "congo=t61rcWkgMzE"),
        ],
    )
    assert _trace_id(got) not in {first, second}
    assert "tracestate" not in got  # it belonged to a context that was not read


async def test_repeated_tracestate_headers_are_one_list_at_the_http_layer(
    tmp_path: Path, traced: OtlpReceiver
) -> None:
    """Two ``tracestate`` headers are joined in order, as one list, and carried by the event."""
    trace = uuid.uuid4().hex
    got = await _served(
        tmp_path,
        [
            ("traceparent", f"00-{trace}-{SPAN}-01"),
            ("tracestate", "foo=1,bar=2"),
            ("tracestate", "rojo=00f067aa0ba902b7"),
        ],
    )
    assert _trace_id(got) == trace
    assert got["tracestate"] == b"foo=1,bar=2,rojo=00f067aa0ba902b7"


async def test_repeated_trace_headers_through_asgi(
    tmp_path: Path, sqlite_store: SqliteLogStore, traced: OtlpReceiver
) -> None:
    """The ASGI entry point treats repeated ``traceparent`` and ``tracestate`` the same way."""
    sources = build(tmp_path, {"whatsapp": {**META, "routes": []}}, {"messages": "messages"})
    _, http = client(sources, sqlite_store)
    first, second = uuid.uuid4().hex, uuid.uuid4().hex
    rows = []
    async with http:
        for index, pairs in enumerate(
            [
                [
                    ("traceparent", f"00-{first}-{SPAN}-01"),
                    ("traceparent", f"00-{second}-{SPAN}-01"),
                ],
                [  # the first alone would be read (a later version's value with a field more)
                    ("traceparent", f"cc-{first}-{SPAN}-01-more"),
                    ("traceparent", f"cc-{second}-{SPAN}-01"),
                ],
                [
                    ("traceparent", f"00-{first}-{SPAN}-01"),
                    ("tracestate", "foo=1"),
                    ("tracestate", "bar=2"),
                ],
            ]
        ):
            body = meta_body(index + 1)
            headers = [("x-hub-signature-256", hub_signature("meta-app-secret", body)), *pairs]
            answer = await http.post("/hooks/whatsapp", content=body, headers=headers)
            assert answer.json()["status"] == "accepted"
            row = await sqlite_store.get(answer.json()["id"])
            assert isinstance(row, LogRow)
            rows.append(event_headers(row))
    duplicated, versioned, combined = rows
    assert _trace_id(duplicated) not in {first, second}
    assert _trace_id(versioned) not in {first, second}
    assert _trace_id(combined) == first
    assert combined["tracestate"] == b"foo=1,bar=2"
