"""Standard Webhooks signs ``{id}.{timestamp}.{body}`` over the id's bytes as sent.

HTTP header values reach the verifier decoded as Latin-1 (one character per byte); the id was
encoded back as UTF-8, so an id with any byte above 0x7F (UTF-8 ``msg_é``, two bytes) was
signed over other bytes than the sender's and a correctly signed delivery was answered 401.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from hostile.ingress_server import raw_request, running_ingress, status_of
from ingress.signing import standard_signature

from pipeline.logstore import Selection

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"  # noqa: S105 - the spec's example secret
SOURCES = {"clerk": {"scheme": "standard_webhooks", "secrets": [SECRET]}}


def _post(port: int, msg_id: bytes, timestamp: int, body: bytes) -> bytes:
    signature = standard_signature(SECRET, msg_id.decode("utf-8"), timestamp, body)
    return (
        f"POST /hooks/clerk HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n".encode()
        + b"webhook-id: "
        + msg_id
        + f"\r\nwebhook-timestamp: {timestamp}\r\nwebhook-signature: {signature}\r\n".encode()
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
    )


async def test_an_id_with_non_ascii_bytes_is_verified_as_sent(tmp_path: Path) -> None:
    """``msg_é`` in UTF-8, signed by the spec's algorithm over those bytes: 200, then duplicate."""
    body = json.dumps({"type": "user.created", "data": {"id": "user_1"}}).encode()
    msg_id = "msg_é1".encode()
    now = int(time.time())
    async with running_ingress(tmp_path, SOURCES) as ingress:
        first = await raw_request(ingress.port, _post(ingress.port, msg_id, now, body), body)
        again = await raw_request(ingress.port, _post(ingress.port, msg_id, now, body), body)
        rows = await ingress.built.store.select(Selection(), limit=10)
    assert (status_of(first), status_of(again)) == (200, 200), first
    assert again.endswith(b'{"status": "duplicate"}')
    assert [row.headers["webhook-id"].encode("latin-1") for row in rows] == [msg_id]
