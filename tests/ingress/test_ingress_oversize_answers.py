"""What a sender of an over-cap body or an over-long request head gets from a served ingress.

``pipeline ingress serve`` answers both itself, before the app reads a body (its HTTP layer,
:mod:`pipeline.ingress.http`; uvicorn only binds and accepts): a body over its source's
``max_body_bytes`` is **413**, whether declared by Content-Length or counted as chunks arrive,
and a request line and headers over ``PIPELINE_INGRESS__MAX_HEAD_BYTES`` (a 64 KiB path) is
**431**. The JSON error body of either names the cap that was passed and the setting that
raises it, so the provider's delivery log tells the operator what to change; the answer came
before the rest of the body was sent (a body declared at 10 GiB, a chunk of 256 MiB of which
2 KiB came). The door's refusals log nothing at the default level: a flood of them does not
fill the ingress's log.

A request target longer than 65,535 bytes is one httptools' URL parser refuses, whatever the
head cap: a target of 65,536 bytes with no headers (a head within the default cap), or any
such target under a head cap raised to 256 KiB, was answered 400 ``invalid HTTP request`` and
logged ``User callback error``. It is **414** now, its body naming that fixed limit.
"""

from __future__ import annotations

import json
import socket
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from ingress.helpers import (
    ingress_env,
    listening_url,
    start_ingress,
    stopped,
    write_sources,
    write_topics,
)

CAP = 1_024
HEAD_CAP = 65_536
ANSWER_S = 30.0
"""The longest an answer may take to come; a bound, not a wait."""
TOO_LARGE = {
    "error": "body too large",
    "max_body_bytes": CAP,
    "setting": "sources.plain.max_body_bytes",
}


TOO_LONG = {"error": "request target too long", "max_target_bytes": 65_535}


@contextmanager
def served(tmp_path: Path, redis_url: str, **extra: str) -> Iterator[tuple[int, Path]]:
    """An ingress with one unsigned source ``plain`` capped at :data:`CAP`; its port and log.

    ``extra``: more environment variables. Its stderr goes to the log.
    """
    topic = f"oversize-{uuid.uuid4().hex[:10]}"
    write_topics(tmp_path / "topics", {topic: "messages"})
    plain = {"scheme": "none", "topic": topic, "max_body_bytes": CAP}
    write_sources(tmp_path / "sources.yaml", {"plain": plain})
    env = ingress_env(tmp_path, redis_url, **extra)
    log = tmp_path / "stderr.log"
    with log.open("w", encoding="utf-8") as stderr:
        proc = start_ingress(env, cwd=tmp_path, stderr=stderr)
    with stopped(proc):
        url = listening_url(proc, log)
        yield int(url.rsplit(":", 1)[1]), log


@pytest.fixture
def ingress(tmp_path: Path, redis_service: str) -> Iterator[tuple[int, Path]]:
    """:func:`served` with the default settings."""
    with served(tmp_path, redis_service) as running:
        yield running


def exchange(port: int, request: bytes) -> tuple[int, dict[str, object]]:
    """Send ``request`` on a new connection; the status and JSON body of the answer.

    The connection must be closed by the ingress after its answer (every refusal closes it).
    """
    with socket.create_connection(("127.0.0.1", port), timeout=ANSWER_S) as conn:
        conn.sendall(request)
        answer = b""
        while chunk := conn.recv(65_536):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 "), answer[:200]
    assert b"content-type: application/json" in head.lower(), head
    return int(head[9:12]), json.loads(body)


def post(path: bytes, headers: bytes, body: bytes = b"") -> bytes:
    """A POST of ``path`` with ``headers`` (CRLF-ended lines) and the start of ``body``."""
    return b"POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\n%s\r\n%s" % (path, headers, body)


def test_a_declared_length_over_the_cap_is_a_413_naming_the_cap(ingress: tuple[int, Path]) -> None:
    """Content-Length over the cap: 413 at once, the body (10 GiB, none of it sent) never read."""
    port, _ = ingress
    status, body = exchange(port, post(b"/hooks/plain", b"Content-Length: 10737418240\r\n"))
    assert (status, body) == (413, TOO_LARGE)


def test_a_whole_body_over_the_cap_is_a_413_naming_the_cap(ingress: tuple[int, Path]) -> None:
    """A body one byte over the cap, sent whole with its Content-Length: 413."""
    port, _ = ingress
    body = b"x" * (CAP + 1)
    request = post(b"/hooks/plain", b"Content-Length: %d\r\n" % len(body), body)
    assert exchange(port, request) == (413, TOO_LARGE)


def test_a_chunked_body_over_the_cap_is_a_413_before_it_ends(ingress: tuple[int, Path]) -> None:
    """Chunked, no length declared: 413 once 2 KiB of a 256 MiB chunk came, the rest unsent."""
    port, _ = ingress
    request = post(
        b"/hooks/plain", b"Transfer-Encoding: chunked\r\n", b"10000000\r\n" + b"x" * 2048
    )
    assert exchange(port, request) == (413, TOO_LARGE)


def test_a_64_kib_path_is_a_431_naming_the_head_cap(ingress: tuple[int, Path]) -> None:
    """A request line past the head cap is answered by the ingress (JSON), not by uvicorn."""
    port, _ = ingress
    path = b"/hooks/plain/" + b"a" * HEAD_CAP
    status, body = exchange(port, post(path, b"Content-Length: 2\r\n", b"{}"))
    assert status == 431
    assert body == {
        "error": "request head too large",
        "max_head_bytes": HEAD_CAP,
        "setting": "PIPELINE_INGRESS__MAX_HEAD_BYTES",
    }


def test_a_long_path_under_the_head_cap_is_the_apps_404(ingress: tuple[int, Path]) -> None:
    """A 60 KiB path fits the head cap: the app answers it (unknown source), as any other path."""
    port, _ = ingress
    path = b"/hooks/" + b"a" * 60_000
    assert exchange(port, post(path, b"Content-Length: 2\r\n", b"{}")) == (
        404,
        {"error": "unknown source"},
    )


def test_a_flood_of_refusals_logs_nothing_at_the_default_level(
    ingress: tuple[int, Path],
) -> None:
    """Fifty 413s and fifty 431s: no line in the ingress's log (WARNING, the default level)."""
    port, log = ingress
    for _ in range(50):
        assert exchange(port, post(b"/hooks/plain", b"Content-Length: 4096\r\n"))[0] == 413
        path = b"/" + b"a" * HEAD_CAP
        assert exchange(port, post(path, b"Content-Length: 0\r\n"))[0] == 431
    assert log.read_text(encoding="utf-8") == ""


def test_a_target_past_the_url_parser_within_the_head_cap_is_a_414(
    ingress: tuple[int, Path],
) -> None:
    """65,536 bytes of target and no header: within the head cap, past httptools' URL limit."""
    port, _ = ingress
    target = b"/hooks/plain/" + b"a" * (HEAD_CAP - len(b"/hooks/plain/"))
    assert exchange(port, b"POST %s HTTP/1.1\r\n\r\n" % target) == (414, TOO_LONG)


def test_a_raised_head_cap_still_answers_a_long_path_414(
    tmp_path: Path, redis_service: str
) -> None:
    """The head cap at 256 KiB: a 100 KB path is 414 (a fixed limit), one of 60 KB still served."""
    with served(tmp_path, redis_service, PIPELINE_INGRESS__MAX_HEAD_BYTES="262144") as (port, _):
        long = exchange(port, post(b"/hooks/" + b"a" * 100_000, b"Content-Length: 2\r\n", b"{}"))
        fits = exchange(port, post(b"/hooks/" + b"a" * 60_000, b"Content-Length: 2\r\n", b"{}"))
    assert long == (414, TOO_LONG)
    assert fits == (404, {"error": "unknown source"})
