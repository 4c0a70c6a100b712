"""A client refused mid-request reads its refusal: a refused connection is closed lingering.

The door answers a body over its source's cap (413) or a head over the head cap (431) before the
client has sent the rest. It closed the connection at once, with the client's bytes still
arriving: the kernel answered them with a reset, and a client that writes its whole request
before it reads (Python's urllib) got ``Broken pipe`` instead of the 413, at 10 MB over a 1 KiB
cap every time (1 MB: 4 times in 10). A webhook provider takes that for a network error and
retries, often for days; a 413 it takes as final.

After a refusal the ingress now shuts down its side (the answer and then end of file) and reads
and drops what the client still sends, as HTTP servers do (nginx's ``lingering_close``), for at
most :data:`~pipeline.ingress.http.LINGER_BYTES`, :data:`~pipeline.ingress.http.LINGER_S` in all
and :data:`~pipeline.ingress.http.LINGER_IDLE_S` of silence; the connection counts under the
connection bound all the while. A client that sends for ever is cut off at the byte cap, and its
place under the bound is given back.
"""

from __future__ import annotations

import contextlib
import json
import socket
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from ingress.helpers import (
    evicted,
    ingress_env,
    listening_url,
    start_ingress,
    stopped,
    write_sources,
    write_topics,
)

from pipeline.ingress.http import LINGER_BYTES
from pipeline.testing.ports import free_port

CAP = 1_024
HEAD_CAP = 4_096
BOUND = 4
ANSWER_S = 30.0
"""The longest an answer may take to come; a bound, not a wait."""
TOO_LARGE = {
    "error": "body too large",
    "max_body_bytes": CAP,
    "setting": "sources.plain.max_body_bytes",
}
HALF_HEAD = b"POST /hooks/nowhere HTTP/1.1\r\nHost: ingress\r\n"  # never finished
NOTHING = b"GET /nothing HTTP/1.1\r\nHost: ingress\r\n\r\n"  # answered 404
CHUNK = b"x" * 65_536
SEND_AT_MOST = 64 * LINGER_BYTES
"""What the endless sender gives up at: the ingress did not cut it off."""


@contextlib.contextmanager
def served(
    tmp_path: Path, redis_url: str, topic: str, body_timeout_s: str = "120"
) -> Iterator[tuple[int, int]]:
    """An ingress with one unsigned source ``plain`` capped at :data:`CAP`; its port, metrics port.

    Its heads are capped at :data:`HEAD_CAP`, its connections at :data:`BOUND`; its bodies
    have ``body_timeout_s`` (by default long enough that no timer fires in a test).
    """
    write_topics(tmp_path / "topics", {topic: "messages"})
    plain = {"scheme": "none", "topic": topic, "max_body_bytes": CAP}
    write_sources(tmp_path / "sources.yaml", {"plain": plain})
    metrics_port = free_port()
    env = ingress_env(
        tmp_path,
        redis_url,
        PIPELINE_INGRESS__MAX_HEAD_BYTES=str(HEAD_CAP),
        PIPELINE_INGRESS__MAX_CONNECTIONS=str(BOUND),
        PIPELINE_INGRESS__METRICS_PORT=str(metrics_port),
        PIPELINE_INGRESS__BODY_TIMEOUT_S=body_timeout_s,
    )
    log = tmp_path / "stderr.log"
    with log.open("w", encoding="utf-8") as stderr:
        proc = start_ingress(env, cwd=tmp_path, stderr=stderr)
    with stopped(proc):
        url = listening_url(proc, log)
        yield int(url.rsplit(":", 1)[1]), metrics_port
        assert proc.poll() is None
    lines = log.read_text(encoding="utf-8").splitlines()
    # Nothing logged at the default level but the evictions a test makes on purpose.
    assert [line for line in lines if "PIPELINE_INGRESS__MAX_CONNECTIONS" not in line] == []


@pytest.fixture
def ingress(tmp_path: Path, redis_service: str, unique: str) -> Iterator[tuple[int, int]]:
    """:func:`served` on a topic of the test's own."""
    with served(tmp_path, redis_service, f"linger-{unique}") as ports:
        yield ports


def urllib_post(port: int, body: bytes, **headers: str) -> tuple[int, dict[str, object]]:
    """POST ``body`` to ``/hooks/plain`` with urllib (it sends it whole, then reads the answer).

    The status and JSON body of the answer; urllib's own error (Broken pipe, reset) if none.
    """
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/hooks/plain", data=body, headers=headers, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=ANSWER_S) as answer:  # noqa: S310
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as refused:
        return refused.code, json.loads(refused.read())


@pytest.mark.parametrize("size", [1_000_000, 10_000_000])
def test_urllib_reads_the_413_of_a_body_far_over_the_cap(
    ingress: tuple[int, int], size: int
) -> None:
    """1 MB and 10 MB over a 1 KiB cap, five times each: urllib gets the 413 and its JSON body."""
    port, _ = ingress
    for _ in range(5):
        assert urllib_post(port, b"x" * size) == (413, TOO_LARGE)


def test_urllib_reads_the_431_of_a_head_over_the_cap_with_a_large_body(
    ingress: tuple[int, int],
) -> None:
    """A header past the head cap, then 10 MB of body: urllib gets the 431 naming the cap."""
    port, _ = ingress
    status, body = urllib_post(port, b"x" * 10_000_000, **{"X-Big": "a" * (2 * HEAD_CAP)})
    assert status == 431
    assert body == {
        "error": "request head too large",
        "max_head_bytes": HEAD_CAP,
        "setting": "PIPELINE_INGRESS__MAX_HEAD_BYTES",
    }


def _stalled_then_sent_on(port: int) -> bytes:
    """What a client reads that stalls mid-body until its 408, then sends 2 MB more."""
    with socket.create_connection(("127.0.0.1", port), timeout=ANSWER_S) as sock:
        sock.sendall(
            b"POST /hooks/plain HTTP/1.1\r\nHost: ingress\r\nContent-Length: 1000\r\n\r\n{"
        )
        answer = b""
        while b"}" not in answer:  # the 408 comes once the time limit passed
            part = sock.recv(4096)
            assert part, answer
            answer += part
        sock.sendall(b"x" * 2_000_000)
        while part := sock.recv(4096):
            answer += part
    return answer


def test_a_client_sending_on_after_its_408_is_not_reset(
    tmp_path: Path, redis_service: str, unique: str
) -> None:
    """A body stalled past the time limit is 408; the rest, sent after it, is read and dropped.

    The client then reads the end of the connection, not a reset.
    """
    with served(tmp_path, redis_service, f"linger-{unique}", body_timeout_s="0.5") as (port, _):
        answer = _stalled_then_sent_on(port)
    assert answer.startswith(b"HTTP/1.1 408 ")
    assert answer.endswith(b'{"error": "body not received in time"}')


def _sent_until_cut_off(port: int) -> int:
    """Bytes a client sends after a refused head until the ingress cuts it off (or it gives up)."""
    with socket.create_connection(("127.0.0.1", port), timeout=ANSWER_S) as sock:
        sock.sendall(
            b"POST /hooks/plain HTTP/1.1\r\nHost: ingress\r\nContent-Length: 10737418240\r\n\r\n"
        )
        sent = 0
        with contextlib.suppress(OSError):  # Broken pipe or reset: cut off
            while sent < SEND_AT_MOST:
                sock.sendall(CHUNK)
                sent += len(CHUNK)
    return sent


def _served_so_far(metrics_port: int) -> None:
    """A round trip through the metrics port: the ingress's loop has run what came before it."""
    with socket.create_connection(("127.0.0.1", metrics_port), timeout=ANSWER_S) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: ingress\r\nConnection: close\r\n\r\n")
        assert sock.recv(64).startswith(b"HTTP/1.1 200"), "the metrics port did not answer"


def _stall(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=ANSWER_S)
    sock.sendall(HALF_HEAD)
    return sock


def _answered_once(port: int) -> socket.socket:
    """A connection answered once, then idle: every connection opened before it is admitted."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=ANSWER_S)
    sock.sendall(NOTHING)
    assert sock.recv(4096).startswith(b"HTTP/1.1 404")
    return sock


def test_a_client_sending_for_ever_is_cut_off_and_its_place_given_back(
    ingress: tuple[int, int],
) -> None:
    """Past its 413 the ingress reads at most LINGER_BYTES, then closes; the bound is whole again.

    Cut off at the byte cap: the client got more than it through (it was read and dropped, not
    refused at once) and far less than it would have sent. Then BOUND connections fit under the
    bound, and one more evicts the oldest of them: the cut-off one neither counts nor is open.
    """
    port, metrics_port = ingress
    sent = _sent_until_cut_off(port)
    assert LINGER_BYTES < sent < SEND_AT_MOST
    _served_so_far(metrics_port)
    held: list[socket.socket] = []
    try:
        held += [_stall(port) for _ in range(BOUND - 1)]
        held.append(_answered_once(port))
        assert not any(evicted(sock) for sock in held)
        held.append(_answered_once(port))
        assert [evicted(sock) for sock in held] == [True] + [False] * BOUND
    finally:
        for sock in held:
            sock.close()
