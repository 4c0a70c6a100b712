"""HEAD on ``/hooks/{source}`` is answered as GET without a body (RFC 9110: GET implies HEAD).

It was 405 ``Allow: GET, POST``. Every source answers GET (Meta's subscription handshake: the
challenge when the verify token matches, else 403, also for a source with no token), so HEAD now
gets GET's status and headers, Content-Length included, and no body; another method is 405
``Allow: GET, HEAD, POST``. Served over loopback by the ingress's own HTTP layer.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from hostile.ingress_server import running_ingress

SOURCES = {
    "whatsapp": {"scheme": "meta", "secrets": ["app-secret"], "verify_token": "let-me-in"},
    "plain": {"scheme": "none"},
}
GOOD = "hub.mode=subscribe&hub.verify_token=let-me-in&hub.challenge=1158201444"
WRONG = "hub.mode=subscribe&hub.verify_token=guess&hub.challenge=1"


async def exchange(port: int, method: str, target: str) -> tuple[int, dict[str, str], bytes]:
    """One request, ``Connection: close``; status, headers and every byte after the head."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(f"{method} {target} HTTP/1.1\r\nHost: i\r\nConnection: close\r\n\r\n".encode())
        await writer.drain()
        async with asyncio.timeout(30):
            answer = await reader.read(-1)  # to the server's close
    finally:
        writer.close()
        await writer.wait_closed()
    head, _, rest = answer.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, v in (line.split(":", 1) for line in lines)}
    return int(status_line.split()[1]), headers, rest


async def test_head_on_the_handshake_is_get_without_a_body(tmp_path: Path) -> None:
    """The challenge's status and length, no bytes of it; a wrong token's 403 alike."""
    async with running_ingress(tmp_path, SOURCES) as ingress:
        got = await exchange(ingress.port, "GET", f"/hooks/whatsapp?{GOOD}")
        head = await exchange(ingress.port, "HEAD", f"/hooks/whatsapp?{GOOD}")
        refused_get = await exchange(ingress.port, "GET", f"/hooks/whatsapp?{WRONG}")
        refused_head = await exchange(ingress.port, "HEAD", f"/hooks/whatsapp?{WRONG}")
        counters = dict(ingress.built.app.counters)
    assert got[0] == 200
    assert got[2] == b"1158201444"
    assert head[0] == 200
    assert head[1]["content-length"] == "10"
    assert head[1]["content-type"] == "text/plain"
    assert head[2] == b""
    assert (refused_get[0], refused_head[0]) == (403, 403)
    assert refused_head[1]["content-length"] == refused_get[1]["content-length"]
    assert refused_head[2] == b""
    assert counters["whatsapp", "handshake"] == 2
    assert counters["whatsapp", "handshake_refused"] == 2


async def test_other_methods_are_405_naming_head(tmp_path: Path) -> None:
    """PUT and DELETE: 405, Allow lists GET, HEAD and POST; a source without a token too."""
    async with running_ingress(tmp_path, SOURCES) as ingress:
        put = await exchange(ingress.port, "PUT", "/hooks/whatsapp")
        delete = await exchange(ingress.port, "DELETE", "/hooks/plain")
        plain_head = await exchange(ingress.port, "HEAD", "/hooks/plain")
    assert (put[0], delete[0]) == (405, 405)
    assert put[1]["allow"] == delete[1]["allow"] == "GET, HEAD, POST"
    assert plain_head[0] == 403  # as its GET: no token, no handshake
    assert plain_head[2] == b""
