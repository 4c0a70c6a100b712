"""Unfinished bodies held by many connections: the memory they take is bounded.

A body is buffered until it is whole, and nothing about the sender is known before that: no
signature, no tenant. Without a bound, connections that each send most of a ``max_body_bytes``
body and stall (for up to ``body_timeout_s``) hold that much memory each, as many connections as
the attacker opens (400 of them took the ingress from 78 MB to 490 MB). The bytes of the bodies
left unfinished by a read are counted across every connection of the server; a read that takes
them past ``PIPELINE_INGRESS__MAX_UNFINISHED_BYTES`` is answered 503, its
connection closed and its bytes let go, and a body that is whole within its read is never
counted.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path

import httpx
import pytest
from hostile.ingress_server import running_ingress, status_of
from ingress.signing import hub_signature
from runtime.helpers import eventually

from pipeline.errors import ConfigError

SECRET = "unfinished-secret"  # noqa: S105 - a test secret
GITHUB = {
    "github": {
        "scheme": "github",
        "secrets": [SECRET],
        "tenant": {"pointer": "/repository/owner/login"},
        "max_body_bytes": 1_048_576,
    }
}
BUDGET_BYTES = 3_000_000
HELD_BYTES = 900_000
CONNECTIONS = 6
FIT = BUDGET_BYTES // HELD_BYTES


def _head(port: int, length: int, signature: str = "sha256=" + "0" * 64) -> bytes:
    return (
        f"POST /hooks/github HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Content-Type: application/json\r\nX-Hub-Signature-256: {signature}\r\n"
        f"Content-Length: {length}\r\n\r\n"
    ).encode()


async def _answer(reader: asyncio.StreamReader) -> int:
    """The status of the answer, 0 when the connection was closed (or reset) without one.

    No answer within 20 s fails the test (a TimeoutError, which is no ConnectionError).
    """
    async with asyncio.timeout(20):
        try:
            return status_of(await reader.read(65_536))
        except ConnectionError:
            return 0


async def _small_webhook(url: str) -> int:
    """The status a small signed GitHub webhook posted to the ingress at ``url`` is answered."""
    small = json.dumps({"repository": {"owner": {"login": "small"}}}).encode()
    async with httpx.AsyncClient(base_url=url) as client:
        answer = await client.post(
            "/hooks/github",
            content=small,
            headers={"x-hub-signature-256": hub_signature(SECRET, small)},
        )
    return answer.status_code


async def test_unfinished_bodies_past_the_budget_are_refused_and_others_still_served(
    tmp_path: Path,
) -> None:
    """Six connections each hold 900 KB of a 1 MiB body under a 3 MB budget.

    At most three fit: the reads past the budget are refused 503 and their connections closed.
    Once three are refused, each connection's body is finished (forged, so 401): the ones still
    open are answered, none waits for the body timeout.
    The budget is let go with the bodies, so a signed large body sent in two parts afterwards
    and a small one are accepted.
    """
    length = 1_000_000
    async with running_ingress(
        tmp_path, GITHUB, body_timeout_s=60, max_unfinished_bytes=BUDGET_BYTES
    ) as ingress:
        conns = [
            await asyncio.open_connection("127.0.0.1", ingress.port) for _ in range(CONNECTIONS)
        ]
        for _, writer in conns:
            writer.write(_head(ingress.port, length) + b"x" * HELD_BYTES)
        for _, writer in conns:
            with contextlib.suppress(ConnectionError, OSError):
                await writer.drain()
        counters = ingress.built.app.counters
        # At most three hold their 900 KB: the others are refused as the server reads them.
        await eventually(lambda: counters["github", "body_budget"] >= CONNECTIONS - FIT)
        for _, writer in conns:  # the rest of each body: a whole (forged) request
            with contextlib.suppress(ConnectionError, OSError, RuntimeError):
                writer.write(b"x" * (length - HELD_BYTES))
                await writer.drain()
        statuses = [await _answer(reader) for reader, _ in conns]
        for _, writer in conns:
            writer.close()
        refused = counters["github", "body_budget"]

        body = json.dumps({"repository": {"owner": {"login": "octo"}}, "pad": "p" * 600_000})
        signed = body.encode()
        reader, writer = await asyncio.open_connection("127.0.0.1", ingress.port)
        writer.write(_head(ingress.port, len(signed), hub_signature(SECRET, signed)))
        writer.write(signed[:300_000])
        await writer.drain()
        writer.write(signed[300_000:])
        large = await _answer(reader)
        writer.close()
        answer = await _small_webhook(ingress.url)
    assert refused >= CONNECTIONS - FIT, statuses
    assert statuses.count(401) <= FIT, statuses
    assert set(statuses) <= {401, 503, 0}, statuses
    assert (large, answer) == (200, 200)


async def test_unfinished_heads_count_towards_the_same_bound(tmp_path: Path) -> None:
    """Six connections each send 50 KB of a head (under the 64 KiB cap) under a 160 KB bound.

    At most three fit: the others are answered 503 (or closed) before their heads end. The
    heads of the ones left open are then finished and answered (401: no signature).
    """
    pad = b"a" * 50_000
    small = {"github": {**GITHUB["github"], "max_body_bytes": 65_536}}  # one request fits
    async with running_ingress(
        tmp_path, small, body_timeout_s=60, max_unfinished_bytes=160_000
    ) as ingress:
        conns = [
            await asyncio.open_connection("127.0.0.1", ingress.port) for _ in range(CONNECTIONS)
        ]
        for _, writer in conns:
            writer.write(
                f"POST /hooks/github HTTP/1.1\r\nHost: 127.0.0.1:{ingress.port}\r\n".encode()
            )
            writer.write(b"X-Pad: " + pad)
        answers = {asyncio.ensure_future(_answer(reader)): i for i, (reader, _) in enumerate(conns)}
        pending = set(answers)
        statuses: dict[int, int] = {}
        while len(statuses) < CONNECTIONS - 3:  # the refusals come without the heads' ends
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            statuses |= {answers[task]: task.result() for task in done}
        for i, (_, writer) in enumerate(conns):
            if i not in statuses:
                writer.write(b"\r\nContent-Length: 2\r\n\r\n{}")
        for task in pending:
            statuses[answers[task]] = await task
        for _, writer in conns:
            writer.close()
        answer = await _small_webhook(ingress.url)
    values = list(statuses.values())
    assert values.count(401) <= 3, values
    assert set(values) <= {401, 503, 0}, values
    assert answer == 200


async def test_a_bound_below_one_request_of_a_source_is_refused_at_start(tmp_path: Path) -> None:
    """Below one whole request, every body arriving in parts would be refused: one line, now."""
    with pytest.raises(ConfigError) as refused:
        async with running_ingress(tmp_path, GITHUB, max_unfinished_bytes=262_144):
            pass
    line = str(refused.value)
    assert "PIPELINE_INGRESS__MAX_UNFINISHED_BYTES=262144 is below one request of source" in line
    assert f"raise it to at least {1_048_576 + 65_536}" in line
