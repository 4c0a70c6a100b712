"""The ingress's HTTP layer against a running server: order, keep-alive and the door's refusals.

:mod:`pipeline.ingress.http` parses requests itself and hands webhooks to the app without ASGI,
so what uvicorn's protocol did for it is shown here on raw sockets: pipelined requests answered
in order, ``Expect: 100-continue``, HTTP/1.0, bytes that are not HTTP, bodies over the limit
(declared or streamed in chunks), that nothing refused reaches the log, and that a closed
connection leaves nothing for the cyclic garbage collector.
"""

from __future__ import annotations

import asyncio
import gc
import json
import re
from pathlib import Path

import uvloop
from hostile.ingress_server import running_ingress, status_of
from ingress.signing import hub_signature

from pipeline.ingress.http import IngressProtocol
from pipeline.logstore import Selection

SECRET = "http-layer-secret"  # noqa: S105 - a test secret
GITHUB = {
    "github": {
        "scheme": "github",
        "secrets": [SECRET],
        "tenant": {"pointer": "/repository/owner/login"},
        "max_body_bytes": 4096,
    }
}
_LENGTH = re.compile(rb"content-length: (\d+)")


def _signed(port: int, owner: str, *, version: str = "1.1", extra: str = "") -> bytes:
    body = json.dumps({"repository": {"owner": {"login": owner}}}).encode()
    head = (
        f"POST /hooks/github HTTP/{version}\r\nHost: 127.0.0.1:{port}\r\n"
        f"Content-Type: application/json\r\nX-Hub-Signature-256: {hub_signature(SECRET, body)}\r\n"
        f"Content-Length: {len(body)}\r\n{extra}\r\n"
    )
    return head.encode() + body


async def _answers(reader: asyncio.StreamReader, count: int) -> list[tuple[bytes, bytes]]:
    """``count`` answers read off one connection: (head, body) each."""
    out = []
    for _ in range(count):
        head = await reader.readuntil(b"\r\n\r\n")
        length = _LENGTH.search(head)
        assert length is not None, head
        out.append((head, await reader.readexactly(int(length[1]))))
    return out


async def _stored(ingress: object) -> int:
    counts = await ingress.built.store.count_by_state(Selection())  # type: ignore[attr-defined]
    return sum(counts.values())


async def test_pipelined_requests_are_answered_in_order_on_one_connection(
    tmp_path: Path,
) -> None:
    """Three requests in one write, a 404 between two webhooks: three answers in that order."""
    async with running_ingress(tmp_path, GITHUB) as ingress:
        reader, writer = await asyncio.open_connection("127.0.0.1", ingress.port)
        nowhere = f"GET /hooks/nowhere HTTP/1.1\r\nHost: 127.0.0.1:{ingress.port}\r\n\r\n"
        writer.write(
            _signed(ingress.port, "first") + nowhere.encode() + _signed(ingress.port, "second")
        )
        async with asyncio.timeout(10):
            answers = await _answers(reader, 3)
            # The connection stays open for a fourth.
            writer.write(_signed(ingress.port, "third"))
            answers += await _answers(reader, 1)
        writer.close()
        stored = await _stored(ingress)
    assert [status_of(head) for head, _ in answers] == [200, 404, 200, 200]
    accepted = [json.loads(body) for head, body in answers if status_of(head) == 200]
    assert [answer["status"] for answer in accepted] == ["accepted"] * 3
    assert len({answer["id"] for answer in accepted}) == 3
    assert b"connection: close" not in b"".join(head for head, _ in answers)
    assert stored == 3


async def test_expect_continue_gets_100_before_the_body(tmp_path: Path) -> None:
    """A client that waits for ``100 Continue`` gets it, then the answer to its body."""
    async with running_ingress(tmp_path, GITHUB) as ingress:
        whole = _signed(ingress.port, "patient", extra="Expect: 100-continue\r\n")
        head, body = whole.split(b"\r\n\r\n", 1)
        reader, writer = await asyncio.open_connection("127.0.0.1", ingress.port)
        writer.write(head + b"\r\n\r\n")
        async with asyncio.timeout(10):
            interim = await reader.readuntil(b"\r\n\r\n")
            writer.write(body)
            ((answer, _),) = await _answers(reader, 1)
        writer.close()
    assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
    assert status_of(answer) == 200


async def test_http_1_0_is_answered_and_closed(tmp_path: Path) -> None:
    """An HTTP/1.0 request without keep-alive gets its answer and ``connection: close``."""
    async with running_ingress(tmp_path, GITHUB) as ingress:
        reader, writer = await asyncio.open_connection("127.0.0.1", ingress.port)
        writer.write(_signed(ingress.port, "old", version="1.0"))
        async with asyncio.timeout(10):
            answer = await reader.read()  # until the server closes
        writer.close()
    assert status_of(answer) == 200
    assert b"connection: close\r\n" in answer


async def test_bytes_that_are_not_http_are_a_400_and_the_connection_closes(
    tmp_path: Path,
) -> None:
    """Garbage after a good request: the good one is answered, then 400, then the socket ends."""
    async with running_ingress(tmp_path, GITHUB) as ingress:
        reader, writer = await asyncio.open_connection("127.0.0.1", ingress.port)
        writer.write(_signed(ingress.port, "fine") + b"\x00\x01 NOT HTTP\r\n\r\n")
        async with asyncio.timeout(10):
            answer = await reader.read()
        writer.close()
        stored = await _stored(ingress)
    statuses = [int(code) for code in re.findall(rb"HTTP/1\.1 (\d{3}) ", answer)]
    assert statuses == [200, 400]
    assert stored == 1


async def test_a_chunked_body_over_the_limit_is_a_413_and_nothing_is_stored(
    tmp_path: Path,
) -> None:
    """No Content-Length to refuse up front: the chunks are counted as they come."""
    async with running_ingress(tmp_path, GITHUB) as ingress:
        reader, writer = await asyncio.open_connection("127.0.0.1", ingress.port)
        head = (
            f"POST /hooks/github HTTP/1.1\r\nHost: 127.0.0.1:{ingress.port}\r\n"
            "Transfer-Encoding: chunked\r\n\r\n"
        ).encode()
        chunk = b"x" * 1024
        writer.write(head + b"".join(b"400\r\n" + chunk + b"\r\n" for _ in range(5)))
        async with asyncio.timeout(10):
            answer = await reader.read()
        writer.close()
        stored = await _stored(ingress)
        counted = ingress.built.app.counters["github", "too_large"]
    assert status_of(answer) == 413
    assert b"connection: close\r\n" in answer
    assert (stored, counted) == (0, 1)


async def test_a_declared_length_over_the_limit_is_refused_before_the_body(
    tmp_path: Path,
) -> None:
    """A Content-Length over ``max_body_bytes`` is answered at once, without waiting for it."""
    async with running_ingress(tmp_path, GITHUB) as ingress:
        reader, writer = await asyncio.open_connection("127.0.0.1", ingress.port)
        writer.write(
            f"POST /hooks/github HTTP/1.1\r\nHost: 127.0.0.1:{ingress.port}\r\n"
            f"Content-Length: {10**9}\r\n\r\n{{".encode()
        )
        async with asyncio.timeout(10):
            answer = await reader.read()
        writer.close()
        counted = ingress.built.app.counters["github", "too_large"]
    assert status_of(answer) == 413
    assert counted == 1


async def test_a_head_that_never_ends_is_a_408_and_the_connection_closes(tmp_path: Path) -> None:
    """Headers dripped without their end hold nothing past the body time limit."""
    async with running_ingress(tmp_path, GITHUB, body_timeout_s=0.2) as ingress:
        reader, writer = await asyncio.open_connection("127.0.0.1", ingress.port)
        writer.write(b"POST /hooks/github HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: a")
        await writer.drain()
        async with asyncio.timeout(10):
            answer = await reader.read()  # until the server closes
        writer.close()
        stored = await _stored(ingress)
    assert status_of(answer) == 408
    assert b"request head not received in time" in answer
    assert stored == 0


async def test_a_path_of_escaped_utf8_is_a_404_not_a_500(tmp_path: Path) -> None:
    """A request target with percent-escaped UTF-8 (``/hooks/€``) reaches the app's 404."""
    async with running_ingress(tmp_path, GITHUB) as ingress:
        reader, writer = await asyncio.open_connection("127.0.0.1", ingress.port)
        writer.write(b"GET /hooks/%E2%82%AC HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        async with asyncio.timeout(10):
            ((answer, body),) = await _answers(reader, 1)
        writer.close()
    assert status_of(answer) == 404
    assert json.loads(body) == {"error": "unknown source"}


def test_a_closed_connection_is_freed_at_once_not_left_to_the_cycle_collector(
    tmp_path: Path,
) -> None:
    """On uvloop, as ``pipeline ingress serve`` runs: a closed connection's objects are freed.

    With the cyclic collector off, no protocol object of 20 answered and closed connections
    stays in memory. A protocol tied in a cycle with its parser and transport waits for a full
    collection, which comes rarely once the start-up objects are frozen; under a steady stream
    of short connections the memory they hold grew by tens of MiB in minutes.
    """

    async def scenario() -> tuple[list[int], int]:
        async with running_ingress(tmp_path, GITHUB) as ingress:
            statuses = []
            for i in range(20):
                reader, writer = await asyncio.open_connection("127.0.0.1", ingress.port)
                writer.write(_signed(ingress.port, f"owner-{i}"))
                async with asyncio.timeout(10):
                    ((head, _),) = await _answers(reader, 1)
                statuses.append(status_of(head))
                writer.close()
                await writer.wait_closed()
        # The server has stopped: it waited for every connection to end.
        left = sum(isinstance(o, IngressProtocol) for o in gc.get_objects())
        return statuses, left

    gc.collect()
    gc.disable()
    try:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            statuses, left = runner.run(scenario())
    finally:
        gc.enable()
    assert statuses == [200] * 20
    assert left == 0
