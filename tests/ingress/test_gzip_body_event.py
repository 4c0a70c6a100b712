"""A gzip body a source reads nothing from: its event says how it is encoded.

The ingress does not decode ``Content-Encoding`` (docs/ingress.md): the body is verified, stored
and produced as the bytes sent. The event then carries the encoding, so a consumer knows to
decompress what it got.
"""

from __future__ import annotations

import gzip
import hashlib
import hmac
import json
from pathlib import Path

from contract.helpers import make_topic
from ingress.helpers import build, client
from ingress.test_produce import wait_until_states

from pipeline.envelope import Message
from pipeline.ingress import headers as h
from pipeline.ingress.dispatch import Dispatcher
from pipeline.logstore import RowState
from pipeline.logstore.sqlite import SqliteLogStore
from pipeline.transport.protocol import Transport

SECRET = "partner-secret"  # noqa: S105 - a test secret
ENCODING = "pl-content-encoding"


def partner(topic: str) -> dict[str, object]:
    """An hmac source with no tenant, key, event id or route: it reads nothing of the body."""
    return {
        "scheme": "hmac",
        "secrets": [SECRET],
        "hmac": {"header": "X-Sig", "algorithm": "sha256", "encoding": "hex"},
        "topic": topic,
    }


def signed(body: bytes, **more: str) -> dict[str, str]:
    """The partner's headers for ``body``, signed over the bytes sent (compressed or not)."""
    mac = hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()
    return {"x-sig": mac, "content-type": "application/json", **more}


async def read_all(transport: Transport, topic: str, count: int) -> list[Message]:
    """The first ``count`` events of ``topic``, read by a reader of no group (nothing left)."""
    reader = transport.reader([topic], start_at="earliest")
    got: list[Message] = []
    try:
        for _ in range(120):  # a bound on empty polls of 0.5 s, not a wait for something
            got += await reader.poll(count - len(got), 0.5)
            if len(got) >= count:
                return got
    finally:
        await reader.close()
    raise AssertionError(f"read {len(got)} of {count} events of {topic}")


async def test_a_gzip_body_is_produced_as_sent_with_its_encoding(
    tmp_path: Path, sqlite_store: SqliteLogStore, transport: Transport, unique: str
) -> None:
    """The event holds the gzip bytes and ``pl-content-encoding: gzip``; a plain body has none."""
    topic = f"partner-{unique}"
    await make_topic(transport, topic, 1)
    sources = build(tmp_path, {"partner": partner(topic)}, {topic: "p"})
    assert not sources["partner"].needs_json  # the path where nothing reads the body
    document = json.dumps({"delivery_id": "d-1", "text": "hello " * 50}).encode()
    compressed = gzip.compress(document)
    plain = json.dumps({"delivery_id": "d-2"}).encode()
    dispatcher = Dispatcher(transport.producer(), sqlite_store)
    _, http = client(sources, sqlite_store, dispatcher)
    async with http:
        zipped = await http.post(
            "/hooks/partner",
            content=compressed,
            headers=signed(compressed, **{"content-encoding": "gzip"}),
        )
        as_is = await http.post("/hooks/partner", content=plain, headers=signed(plain))
    assert (zipped.status_code, as_is.status_code) == (200, 200), zipped.text + as_is.text
    await wait_until_states(sqlite_store, {RowState.PRODUCED: 2})
    await dispatcher.close()
    by_row = {m.headers[h.ROW_ID].decode(): m for m in await read_all(transport, topic, 2)}
    gz = by_row[zipped.json()["id"]]
    assert gz.value == compressed  # as sent: the ingress decodes no Content-Encoding
    assert gz.headers.get(ENCODING) == b"gzip"
    assert gzip.decompress(gz.value) == document
    other = by_row[as_is.json()["id"]]
    assert (other.value, other.headers.get(ENCODING)) == (plain, None)
