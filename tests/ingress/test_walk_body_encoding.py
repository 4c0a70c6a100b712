"""A body the door reads is read as the consumers read it: UTF-8 JSON, no byte order mark.

``json.loads`` of bytes guesses the encoding: it skips a UTF-8 BOM and reads UTF-16 and UTF-32.
A typed handler reads the same value with ``model_validate_json``, which takes none of them, so
such a body was answered 200, produced, and dead-lettered by every consumer. At the door it is
refused as the body it is (400, nothing stored, nothing produced), where the sender sees it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pydantic
import pytest
from contract.helpers import wait_for
from hostile.ingress_server import raw_request, running_ingress
from ingress.signing import hub_signature

from pipeline.logstore import Selection
from pipeline.transport.redis_streams.keys import Keys

SECRET = "walk-encoding-secret"  # noqa: S105 - a test secret
SOURCES = {
    "whatsapp": {"scheme": "meta", "secrets": [SECRET], "tenant": {"pointer": "/entry/0/id"}}
}
DOCUMENT = {"object": "whatsapp_business_account", "entry": [{"id": "acme", "changes": []}]}
REFUSED = {
    "utf-8 with BOM": b"\xef\xbb\xbf" + json.dumps(DOCUMENT).encode(),
    "utf-16": json.dumps(DOCUMENT).encode("utf-16"),
    "utf-16-le": json.dumps(DOCUMENT).encode("utf-16-le"),
    "utf-32": json.dumps(DOCUMENT).encode("utf-32"),
}


class _Delivery(pydantic.BaseModel):
    """What a typed consumer of the lane declares (only the field the source reads)."""

    object: str


def _post(port: int, body: bytes) -> bytes:
    return (
        f"POST /hooks/whatsapp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n"
        "Content-Type: application/json\r\n"
        f"X-Hub-Signature-256: {hub_signature(SECRET, body)}\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()


def _answer(raw: bytes) -> tuple[int, bytes]:
    head, _, body = raw.partition(b"\r\n\r\n")
    return int(head[9:12]), body


@pytest.mark.parametrize("body", REFUSED.values(), ids=REFUSED.keys())
def test_a_typed_consumer_cannot_read_these_bodies(body: bytes) -> None:
    """The reason for the door's answer: the runtime's typed decode refuses each of them."""
    with pytest.raises(pydantic.ValidationError):
        _Delivery.model_validate_json(body)


async def test_a_bom_or_utf16_body_is_refused_and_reaches_neither_log_nor_topic(
    tmp_path: Path,
) -> None:
    """Each signed, non-UTF-8 body: 400 ``body is not JSON``; then a UTF-8 one is the only event."""
    async with running_ingress(tmp_path, SOURCES) as ingress:
        answers = {
            name: _answer(await raw_request(ingress.port, _post(ingress.port, body), body))
            for name, body in REFUSED.items()
        }
        plain = json.dumps(DOCUMENT).encode()
        accepted = _answer(await raw_request(ingress.port, _post(ingress.port, plain), plain))
        stored = await ingress.built.store.select(Selection(), limit=10)
        redis = ingress.built.transport.client  # type: ignore[attr-defined]
        stream = Keys(ingress.built.settings.redis.key_prefix).stream(ingress.topic, 0)

        async def produced() -> bool:
            return int(await redis.xlen(stream)) >= 1

        await wait_for(produced, timeout_s=60)
        entries = await redis.xrange(stream)
    assert answers == dict.fromkeys(REFUSED, (400, b'{"error": "body is not JSON"}'))
    assert accepted[0] == 200
    assert [row.body for row in stored] == [plain]
    assert [fields[b"v"] for _, fields in entries] == [plain]
    counters = ingress.built.app.counters
    assert counters["whatsapp", "malformed:body is not JSON"] == len(REFUSED)
