"""The ingress's connection bound: stalled connections cannot take the descriptors webhooks need.

Each client connection holds a file descriptor. Without a bound, hundreds of connections that
send nothing, half a head or half a body took every descriptor under the open-file limit: libuv
then accepted each new connection and closed it at once (its EMFILE fallback), so a signed
webhook on a fresh connection was cut off without an answer, and without a log line, for as long
as the flood held. ``PIPELINE_INGRESS__MAX_CONNECTIONS`` (by default the open-file limit less
:data:`FD_RESERVE` for the log store and the broker, at most :data:`CONNECTIONS_CAP`) bounds
them: a connection past the bound evicts a stalled one (answered 503 if it can be). The tests
show, in order:

- a flood of 330 stalled connections under an open-file limit of 256 leaves room for webhooks:
  each is accepted and logged, a few log lines and a counter say connections were evicted;
- the bound's default is the open-file limit less the reserve, at most a cap (a setting may pass
  the cap), and a bound above the limit less the reserve refuses;
- every way a connection ends (an answer with ``Connection: close``, a 400, a 431, a reset
  mid-head, the client's close after keep-alive, an eviction) gives its place back exactly once:
  after hundreds of them the bound still holds BOUND connections and evicts the oldest stalled;
- the connection evicted is the one that has sent nothing for the longest, not the one opened
  first: an upload sending its body chunk by chunk outlives the idle connections opened between
  its chunks (evicting by age let an attacker cut off any upload slower than BOUND connections);
- an evicted connection whose client reads none of its answers (megabytes of them, past the
  kernel's send buffer) is aborted, not closed after its buffered output: closed, it kept its
  descriptor while it left the count, so each one evicted was a descriptor past the bound.
"""

from __future__ import annotations

import asyncio
import contextlib
import resource
import socket
import sqlite3
import struct
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from contract.helpers import make_topic
from ingress.helpers import (
    evicted,
    ingress_env,
    listening_url,
    meta_body,
    start_empty_ingress,
    start_ingress,
    stopped,
    write_whatsapp_source,
)
from ingress.signing import hub_signature
from runtime.helpers import eventually

from pipeline.config import IngressSettings, Settings
from pipeline.errors import ConfigError
from pipeline.ingress.service import CONNECTIONS_CAP, FD_RESERVE, max_connections
from pipeline.testing.ports import free_port
from pipeline.transport import create_transport

BOUND = 8
"""The bound of every test but the flood's, which keeps the default under its open-file limit."""
HALF_HEAD = b"POST /hooks/nowhere HTTP/1.1\r\nHost: ingress\r\n"  # never finished
HEALTHZ = b"GET /healthz HTTP/1.1\r\nHost: ingress\r\n\r\n"
NOTHING = b"GET /nothing HTTP/1.1\r\nHost: ingress\r\n\r\n"  # answered 404

# The flood
SECRET = "flood-secret"  # noqa: S105 - a test secret
OPEN_FILES = 256
PER_KIND = 110  # three kinds: 330 stalled connections, past the open-file limit
FLOOD_STARTS = (
    b"",
    b"POST /hooks/whatsapp HTTP/1.1\r\nHost: ingress\r\n",
    b"POST /hooks/whatsapp HTTP/1.1\r\nHost: ingress\r\nContent-Length: 1000\r\n\r\n{",
)
Held = list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]

# Every ending
ROUNDS = 20
ENDINGS = (
    b"GET /healthz HTTP/1.1\r\nHost: ingress\r\nConnection: close\r\n\r\n",
    b"NOT HTTP AT ALL\r\n\r\n",  # 400
    b"GET /healthz HTTP/1.1\r\nX-Big: " + b"a" * 5000 + b"\r\n\r\n",  # 431
)

# The upload
CHUNKS = 3 * BOUND
UPLOAD_HEAD = (
    b"POST /hooks/nowhere HTTP/1.1\r\nHost: ingress\r\nContent-Length: %d\r\n\r\n" % CHUNKS
)

# The unread answers
UNREAD = 3 * BOUND  # each one admitted past the first BOUND evicts an earlier one
UNREAD_REQUEST = b"GET /metrics HTTP/1.1\r\nHost: ingress\r\n\r\n"
PIPELINED = 500  # answers of about 7 MB: more than the kernel's send buffer takes (4 MiB)


@contextlib.contextmanager
def _bounded_ingress(
    tmp_path: Path, redis_url: str, **extra: str
) -> Iterator[tuple[subprocess.Popen[str], int]]:
    """An ingress with no sources and a bound of BOUND, and its port; stopped at the end."""
    proc = start_empty_ingress(
        tmp_path, redis_url, PIPELINE_INGRESS__MAX_CONNECTIONS=str(BOUND), **extra
    )
    with stopped(proc):
        yield proc, _port(listening_url(proc))


@contextlib.contextmanager
def _closing() -> Iterator[list[socket.socket]]:
    """A list for the test's sockets, each closed at the end, pass or fail."""
    held: list[socket.socket] = []
    try:
        yield held
    finally:
        for sock in held:
            sock.close()


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def _stall(port: int, start: bytes = HALF_HEAD) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=20)
    sock.sendall(start)
    return sock


def _answered_once(port: int) -> socket.socket:
    """A connection answered once and then idle: admitted (and one evicted past the bound).

    The server accepts connections in the order they connected, and an eviction's 503 is
    written when the connection past the bound is admitted, before this one's answer: every
    connection opened before it is admitted.
    """
    sock = socket.create_connection(("127.0.0.1", port), timeout=20)
    sock.sendall(NOTHING)
    assert sock.recv(4096).startswith(b"HTTP/1.1 404")
    return sock


# The flood: stalled connections past the open-file limit


def _few_open_files() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (OPEN_FILES, OPEN_FILES))


async def _post(url: str, n: int) -> int:
    body = meta_body(n)
    headers = {"x-hub-signature-256": hub_signature(SECRET, body)}
    async with httpx.AsyncClient(base_url=url, timeout=20) as http:
        try:
            response = await http.post("/hooks/whatsapp", content=body, headers=headers)
        except httpx.TransportError:
            return 0  # cut off without an answer
        return response.status_code


async def _flood(port: int) -> Held:
    held: Held = []
    for start in FLOOD_STARTS:
        for _ in range(PER_KIND):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(start)
            held.append((reader, writer))
    return held


async def _metric(url: str) -> str:
    async with httpx.AsyncClient(base_url=url, timeout=20) as http:
        return (await http.get("/metrics")).text


async def _counted(url: str) -> str:
    """``/metrics`` once it counts connections past the bound (refreshed each 0.2 s), or in 10 s."""
    text = ""
    for _ in range(500):
        text = await _metric(url)
        if 'outcome="connection_limit"' in text:
            break
        await asyncio.sleep(0.02)  # polling the next refresh
    return text


async def test_stalled_connections_past_the_fd_limit_leave_room_for_webhooks(
    tmp_path: Path, settings: Settings, redis_service: str, unique: str
) -> None:
    """Webhooks are accepted through the flood and after it; every 200 is a row; few log lines."""
    topic = f"messages-{unique}"
    transport = create_transport(settings, "redis")
    await make_topic(transport, topic, 2)
    write_whatsapp_source(tmp_path, topic, SECRET)
    env = ingress_env(tmp_path, redis_service, PIPELINE_INGRESS__METRICS_INTERVAL_S="0.2")
    log = tmp_path / "stderr.log"
    with log.open("w", encoding="utf-8") as stderr:
        proc = start_ingress(env, stderr=stderr, preexec_fn=_few_open_files)
    held: Held = []
    try:
        with stopped(proc):
            url = listening_url(proc, log)
            try:
                held = await _flood(_port(url))
                during = [await _post(url, n) for n in range(3)]
                assert proc.poll() is None
                for _, writer in held:
                    writer.close()
                after = await _post(url, 3)
                text = await _counted(url)
            finally:
                for _, writer in held:
                    writer.close()
    finally:
        await transport.close()
    assert during == [200, 200, 200]
    assert after == 200
    assert 'outcome="connection_limit"' in text
    with sqlite3.connect(tmp_path / "ingress.db") as db:
        (rows,) = db.execute("SELECT count(*) FROM ingress_log").fetchone()
    assert rows == 4  # every webhook answered 200 is in the log, and only those
    lines = [line for line in log.read_text(encoding="utf-8").splitlines() if "MAX_CONN" in line]
    assert 1 <= len(lines) <= 3, lines  # not one line per connection


# The default


@contextlib.contextmanager
def _soft_limit(soft: int) -> Iterator[None]:
    """This process's soft open-file limit ``soft`` for the ``with`` block, then as it was."""
    before = resource.getrlimit(resource.RLIMIT_NOFILE)
    if before[1] != resource.RLIM_INFINITY and before[1] < soft:
        pytest.skip(f"a soft open-file limit of {soft} is above this process's hard {before[1]}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, before[1]))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, before)


def test_the_bound_defaults_to_the_open_file_limit_less_the_reserve() -> None:
    """Unset, the bound leaves :data:`FD_RESERVE` descriptors; a bound above that refuses."""
    with _soft_limit(1024):
        assert max_connections(IngressSettings()) == 1024 - FD_RESERVE
        assert max_connections(IngressSettings(max_connections=10)) == 10
        with pytest.raises(ConfigError, match="PIPELINE_INGRESS__MAX_CONNECTIONS"):
            max_connections(IngressSettings(max_connections=1024 - FD_RESERVE + 1))


def test_the_default_bound_is_capped_and_a_setting_may_pass_the_cap() -> None:
    """Under a limit far above the cap the default is the cap; a setting goes up to the limit."""
    soft = CONNECTIONS_CAP + FD_RESERVE + 1000
    with _soft_limit(soft):
        assert max_connections(IngressSettings()) == CONNECTIONS_CAP
        room = soft - FD_RESERVE
        assert max_connections(IngressSettings(max_connections=room)) == room
        with pytest.raises(ConfigError, match="PIPELINE_INGRESS__MAX_CONNECTIONS"):
            max_connections(IngressSettings(max_connections=room + 1))


# Every ending gives the place back once


def _answered_then_closed(port: int, request: bytes) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=20) as sock:
        sock.sendall(request)
        while sock.recv(65536):  # the server closes it after its answer
            pass


def _keep_alive_then_client_close(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=20) as sock:
        for _ in range(2):
            sock.sendall(HEALTHZ)
            assert sock.recv(4096).startswith(b"HTTP/1.1 200")


def _reset_mid_head(port: int) -> None:
    sock = _stall(port)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()  # RST


def test_every_ending_gives_the_place_back_once(tmp_path: Path, redis_service: str) -> None:
    """After 280 connections ended every way, the bound holds BOUND and evicts the oldest."""
    with (
        _bounded_ingress(
            tmp_path,
            redis_service,
            PIPELINE_INGRESS__MAX_HEAD_BYTES="4096",
            PIPELINE_INGRESS__BODY_TIMEOUT_S="120",  # heads wait; no timer in the test
        ) as (proc, port),
        _closing() as held,
    ):
        for _ in range(ROUNDS):
            for request in ENDINGS:
                _answered_then_closed(port, request)
            _keep_alive_then_client_close(port)
            _reset_mid_head(port)
            stalled = [_stall(port) for _ in range(BOUND)]
            stalled.append(_answered_once(port))  # one past the bound: the oldest is evicted
            assert [evicted(sock) for sock in stalled] == [True] + [False] * BOUND
            for sock in stalled:
                sock.close()
        _keep_alive_then_client_close(port)  # round trips: the closes above are read
        held += [_stall(port) for _ in range(BOUND - 1)]
        held.append(_answered_once(port))
        assert not any(evicted(sock) for sock in held)  # a lost connection still counted
        held.append(_answered_once(port))
        assert [evicted(sock) for sock in held] == [True] + [False] * BOUND  # one let go twice
        assert proc.poll() is None


# The connection that has sent nothing for the longest is evicted


def _served_so_far(metrics_port: int) -> None:
    """A round trip through the metrics port: the server has read what was sent before it.

    The metrics port is served by the same event loop, outside the connection bound.
    """
    with socket.create_connection(("127.0.0.1", metrics_port), timeout=20) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: ingress\r\nConnection: close\r\n\r\n")
        assert sock.recv(64).startswith(b"HTTP/1.1 200"), "the metrics port did not answer"


def _send(sock: socket.socket, data: bytes) -> None:
    with contextlib.suppress(OSError):  # evicted: the answer says so
        sock.sendall(data)


def _status(sock: socket.socket) -> int:
    answer = b""
    while b"\r\n" not in answer:
        part = sock.recv(4096)
        if not part:
            return 0  # closed without an answer
        answer += part
    return int(answer.split(b" ", 2)[1])


def test_an_upload_sending_chunk_by_chunk_is_not_evicted_for_stalled_connections(
    tmp_path: Path, redis_service: str
) -> None:
    """Stalled connections opened between its chunks are evicted before the upload."""
    metrics_port = free_port()
    with (
        _bounded_ingress(
            tmp_path,
            redis_service,
            PIPELINE_INGRESS__METRICS_PORT=str(metrics_port),
            PIPELINE_INGRESS__BODY_TIMEOUT_S="120",  # heads and bodies wait; no timer in the test
        ) as (proc, port),
        _closing() as held,
    ):
        upload = socket.create_connection(("127.0.0.1", port), timeout=20)
        held.append(upload)
        _send(upload, UPLOAD_HEAD)
        held += [_answered_once(port) for _ in range(BOUND - 1)]  # the bound is reached
        for _ in range(CHUNKS - 1):
            _send(upload, b"a")
            _served_so_far(metrics_port)  # the chunk is read
            held.append(_answered_once(port))  # one past the bound: a stalled one is evicted
        _send(upload, b"a")
        assert _status(upload) == 404  # answered as a whole request (no such source), not 503
        assert proc.poll() is None


# Connections that read no answer are aborted when evicted


def _descriptors(pid: int) -> int:
    return sum(1 for _ in Path(f"/proc/{pid}/fd").iterdir())


def _admitted(sock: socket.socket) -> bool:
    """Whether the server answers ``sock`` (a connection past the bound is closed at once)."""
    sock.settimeout(20)
    try:
        return sock.recv(1, socket.MSG_PEEK) != b""
    except ConnectionError:
        return False


def _unread(port: int) -> socket.socket | None:
    """A connection that pipelines many requests and reads none of the answers (None: refused)."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 2048)
    sock.connect(("127.0.0.1", port))
    sock.setblocking(False)  # noqa: FBT003 - the socket API
    with contextlib.suppress(BlockingIOError, ConnectionError):
        sock.send(UNREAD_REQUEST * PIPELINED)
    if _admitted(sock):
        return sock
    sock.close()
    return None


def _answered(port: int) -> bool:
    """A fresh connection's ``GET /healthz`` is answered (it evicts the oldest stalled one)."""
    with socket.create_connection(("127.0.0.1", port), timeout=20) as sock:
        try:
            sock.sendall(HEALTHZ)
            return sock.recv(64).startswith(b"HTTP/1.1 200")
        except ConnectionError:
            return False


async def test_evicted_connections_that_read_nothing_give_their_descriptor_back(
    tmp_path: Path, redis_service: str
) -> None:
    """However many unread connections are evicted, client descriptors stay within the bound."""
    with _bounded_ingress(tmp_path, redis_service) as (proc, port), _closing() as held:
        at_rest = _descriptors(proc.pid)
        while len(held) < UNREAD:  # a refused one (every one still answering) is tried again
            sock = _unread(port)
            if sock is not None:
                held.append(sock)
        # Fresh connections evict what is left of the unread ones: none may keep its descriptor.
        await eventually(
            lambda: _answered(port) and _descriptors(proc.pid) <= at_rest + BOUND, timeout_s=30
        )
        assert proc.poll() is None
