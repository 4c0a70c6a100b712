"""The signed webhooks of the ingress's tenant floods, and the reading of their answers.

Shared by ``test_ingress_tenant_flood.py`` and the by-hand ``ingress_tenants_rss.py``: each
webhook to the ``flood`` source (Meta's scheme) has a tenant, a contact (the key) and a message
id of its own.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterable

from ingress.signing import hub_signature

SECRET = "flood-secret"  # noqa: S105 - signs the floods' own webhooks


def webhook(run: str, n: int, *, secret: str = SECRET, tenant: str = "") -> bytes:
    """The HTTP/1.1 request of webhook ``n`` of ``run``, signed with ``secret``, keep-alive."""
    value = {
        "contacts": [{"wa_id": f"key-{run}-{n}"}],
        "messages": [{"id": f"wamid.{run}.{n}", "text": {"body": "hello"}}],
    }
    entry = {
        "id": tenant or f"tenant-{run}-{n}",
        "changes": [{"field": "messages", "value": value}],
    }
    body = json.dumps({"entry": [entry]}).encode()
    head = (
        "POST /hooks/flood HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
        f"x-hub-signature-256: {hub_signature(secret, body)}\r\n"
        f"content-length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


async def answer(reader: asyncio.StreamReader) -> int:
    """Read one response; its status."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    length = next(int(v.split(":", 1)[1]) for v in lines if v.lower().startswith("content-length"))
    await reader.readexactly(length)
    return int(lines[0].split()[1])


def flood_source(topic: str) -> dict[str, object]:
    """The ``flood`` source (Meta's scheme) routing to ``topic``: tenant, key and event id."""
    return {
        "scheme": "meta",
        "secrets": [SECRET],
        "tenant": {"pointer": "/entry/0/id"},
        "key": {"pointer": "/entry/0/changes/0/value/contacts/0/wa_id"},
        "event_id": {"pointer": "/entry/0/changes/0/value/messages/0/id"},
        "topic": topic,
    }


async def send_in_turn(port: int, requests: Iterable[bytes], statuses: dict[int, int]) -> None:
    """Send ``requests`` one after the other over one keep-alive connection; count statuses."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        for request in requests:
            writer.write(request)
            status = await answer(reader)
            statuses[status] = statuses.get(status, 0) + 1
    finally:
        writer.close()
        await writer.wait_closed()
