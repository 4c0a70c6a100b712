"""The metrics ports under a flood of stalled connections: probes, scrapes and messages go on.

A metrics port was plain uvicorn: no timeout for a request head that never ends, no bound on
connections. Under an open-file limit of 256, 300 connections to a `pipeline consume` member's
metrics port that sent nothing or half a head took every descriptor (256 open): asyncio logged
"socket.accept() out of system resource" (Too many open files) every second, ``/healthz`` and
``/metrics`` were never answered (the kubelet would have restarted a healthy member), and every
connection the member opened from then on would have failed. The ingress's separate metrics
port was served the same way, beside its webhook port. The tests show, in order:

- a member's metrics port flooded past the open-file limit answers ``/healthz`` and
  ``/metrics``, the member keeps handling messages and its descriptors stay within the bound;
  every connection of the flood is closed by the member, which ends cleanly after;
- a head sent a byte at a time (a slowloris) is refused 408 at its deadline, though it never
  stops sending;
- the ingress's metrics port flooded the same way: the webhook port and the metrics port answer;
- what a scraper and a probe need still works: keep-alive, pipelined requests answered in order,
  ``HEAD``; bytes that are not HTTP and a request past its size are refused, and closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
from ingress.helpers import ROOT, ingress_env, listening_url, start_ingress, stopped
from redis.asyncio import Redis
from runtime.helpers import declare, lane_spec, produce
from support import delete_group_after, serving_metrics

from pipeline.config import Settings
from pipeline.envelope import Record
from pipeline.observability.metrics import Metrics
from pipeline.observability.metrics_http import MAX_CONNECTIONS, MAX_REQUEST_BYTES
from pipeline.observability.server import MetricsServer
from pipeline.testing.ports import free_port
from pipeline.transport import create_transport

OPEN_FILES = 256
FLOOD = 300  # past the open-file limit
STARTS = (b"", b"GET /metrics HTTP/1.1\r\nHost: member\r\n")  # nothing; a head never finished
DURING = [f"during-{n}".encode() for n in range(5)]
SPARE = 32  # descriptors the member may open beside the bound's (its Redis pool, its log)
Held = list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]


def _few_open_files() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (OPEN_FILES, OPEN_FILES))


def _descriptors(pid: int) -> int:
    return sum(1 for _ in Path(f"/proc/{pid}/fd").iterdir())


async def _status(url: str) -> int:
    """The status ``url`` answers; 0 when it is not answered within 20 s."""
    async with httpx.AsyncClient(timeout=20) as http:
        try:
            return (await http.get(url)).status_code
        except httpx.TransportError:
            return 0


async def _flood(port: int) -> Held:
    held: Held = []
    for n in range(FLOOD):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(STARTS[n % len(STARTS)])
        held.append((reader, writer))
    return held


async def _ended(reader: asyncio.StreamReader) -> bytes:
    """What the server sent before it closed the connection (b"" when nothing)."""
    try:
        return await asyncio.wait_for(reader.read(), 60)
    except ConnectionError:
        return b""


@contextlib.asynccontextmanager
async def _member(
    settings: Settings, redis_service: str, unique: str, tmp_path: Path
) -> AsyncIterator[tuple[asyncio.subprocess.Process, int, str, Path]]:
    """A member under OPEN_FILES, ready, its metrics port, its lane and its log; SIGTERM at end."""
    transport = create_transport(settings, "redis")
    spec = lane_spec(f"flood_{unique}", 1, retry={"tiers": ["200ms"]})  # runtime/poison_app.py's
    await declare(transport, spec)
    group = f"g-{unique}"
    delete_group_after(transport, group, spec.topic_names())
    port = free_port()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("PIPELINE_")},
        "POISON_TOPIC": spec.name,
        "POISON_DONE": f"done-{unique}",
        "PIPELINE_REDIS__URL": redis_service,
        "PIPELINE_RUNTIME__METRICS_HOST": "127.0.0.1",
        "PIPELINE_RUNTIME__METRICS_PORT": str(port),
    }
    log = tmp_path / "member.log"
    with log.open("w", encoding="utf-8") as stderr:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            *("-m", "pipeline", "consume", "runtime.poison_app:app", "--group", group),
            *("-t", "redis"),
            cwd=str(Path(__file__).parents[1]),
            env=env,
            stderr=stderr,
            preexec_fn=_few_open_files,
        )
    try:
        while await _status(f"http://127.0.0.1:{port}/readyz") != 200:
            assert proc.returncode is None, log.read_text(encoding="utf-8")
            await asyncio.sleep(0.05)  # polling until it has joined
        yield proc, port, spec.name, log
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), 60)
            except TimeoutError:
                proc.kill()
                await proc.wait()
        await transport.close()


async def test_a_flooded_metrics_port_keeps_probes_scrapes_and_messages_going(
    settings: Settings, redis_service: str, redis: Redis, unique: str, tmp_path: Path
) -> None:
    """300 stalled connections under 256 open files: answered probes, handled messages."""
    async with _member(settings, redis_service, unique, tmp_path) as (proc, port, lane, log):
        at_rest = _descriptors(proc.pid)
        held = await _flood(port)
        transport = create_transport(settings, "redis")
        try:
            healthz = await _status(f"http://127.0.0.1:{port}/healthz")
            scraped = await _status(f"http://127.0.0.1:{port}/metrics")
            during = _descriptors(proc.pid)
            assert (healthz, scraped) == (200, 200), (during, log.read_text(encoding="utf-8"))
            await produce(transport, lane, [Record(value) for value in DURING])
            while len(await redis.smembers(f"done-{unique}")) < len(DURING):
                assert proc.returncode is None, log.read_text(encoding="utf-8")
                await asyncio.sleep(0.05)  # polling the handler's record
            ends = await asyncio.gather(*(_ended(reader) for reader, _ in held))
        finally:
            await transport.close()
            for _, writer in held:
                writer.close()
        proc.send_signal(signal.SIGTERM)
        code = await asyncio.wait_for(proc.wait(), 60)
    text = log.read_text(encoding="utf-8")
    assert during <= at_rest + MAX_CONNECTIONS + SPARE, (at_rest, during)
    assert code == 0, text
    # Evicted for newer ones (nothing said), or at their deadline: a half head 408, idle closed.
    assert all(end == b"" or end.startswith(b"HTTP/1.1 408") for end in ends), set(ends)
    assert sum(end.startswith(b"HTTP/1.1 408") for end in ends) <= MAX_CONNECTIONS
    assert "Too many open files" not in text
    bound_lines = [line for line in text.splitlines() if "bound of the metrics port" in line]
    assert 1 <= len(bound_lines) <= 3, bound_lines  # not one line per connection


async def test_a_head_sent_a_byte_at_a_time_is_refused_at_its_deadline(
    settings: Settings, redis_service: str, unique: str, tmp_path: Path
) -> None:
    """A slowloris never idle is answered 408 and closed; the port answers probes after it."""
    head = b"GET /metrics HTTP/1.1\r\nHost: member\r\nX-Slow: " + b"a" * 10_000
    async with _member(settings, redis_service, unique, tmp_path) as (_, port, _lane, _log):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            answer = b""
            for byte in head:  # about one byte every 0.1 s: the head takes 1000 s
                writer.write(bytes([byte]))
                with contextlib.suppress(TimeoutError):
                    answer = await asyncio.wait_for(reader.read(), 0.1)
                if answer or reader.at_eof():
                    break
        finally:
            writer.close()
        healthz = await _status(f"http://127.0.0.1:{port}/healthz")
    assert answer.startswith(b"HTTP/1.1 408"), answer
    assert healthz == 200


def test_a_flooded_ingress_metrics_port_leaves_both_ports_answering(
    tmp_path: Path, redis_service: str
) -> None:
    """The ingress's own metrics port flooded under 256 open files: both ports answer."""
    metrics_port = free_port()
    (tmp_path / "sources.yaml").write_text("sources: {}\n", encoding="utf-8")
    env = ingress_env(
        tmp_path, redis_service, ROOT / "topics", PIPELINE_INGRESS__METRICS_PORT=str(metrics_port)
    )
    proc = start_ingress(env, cwd=tmp_path, preexec_fn=_few_open_files)
    with stopped(proc):
        url = listening_url(proc)

        async def flooded() -> tuple[int, int]:
            held = await _flood(metrics_port)
            try:
                return (
                    await _status(f"http://127.0.0.1:{metrics_port}/healthz"),
                    await _status(f"{url}/nothing"),  # the webhook port: no such path
                )
            finally:
                for _, writer in held:
                    writer.close()

        statuses = asyncio.run(flooded())
        assert proc.poll() is None
    assert statuses == (200, 404)


@contextlib.asynccontextmanager
async def _serving() -> AsyncIterator[int]:
    """:func:`serve_metrics` in this process, on a free port; stopped at the end."""
    server = MetricsServer(Metrics(), interval_s=3600)
    server.ready = True
    async with serving_metrics(server) as port:
        yield port


async def _exchange(port: int, request: bytes) -> bytes:
    """Everything the port answers ``request`` with, until it closes the connection."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        return await asyncio.wait_for(reader.read(), 20)
    finally:
        writer.close()


async def test_keep_alive_pipelining_and_head_work_and_bad_requests_are_refused() -> None:
    """Three requests on one connection answered in order; a 400 and a 431 close theirs."""
    pipelined = (
        b"GET /healthz HTTP/1.1\r\nHost: m\r\n\r\n"
        b"HEAD /metrics HTTP/1.1\r\nHost: m\r\n\r\n"
        b"GET /readyz HTTP/1.1\r\nHost: m\r\nConnection: close\r\n\r\n"
    )
    big = b"GET /metrics HTTP/1.1\r\nX-Big: " + b"a" * MAX_REQUEST_BYTES + b"\r\n\r\n"
    async with _serving() as port:
        answers = await _exchange(port, pipelined)
        garbage = await _exchange(port, b"NOT HTTP AT ALL\r\n\r\n")
        too_big = await _exchange(port, big)
        async with httpx.AsyncClient(timeout=20) as http:  # one connection, kept alive
            statuses = [(await http.get(f"http://127.0.0.1:{port}/healthz")).status_code]
            statuses.append((await http.get(f"http://127.0.0.1:{port}/nowhere")).status_code)
    heads = [part.split(b"\r\n", 1)[0] for part in answers.split(b"HTTP/1.1 ")[1:]]
    assert heads == [b"200 OK", b"200 OK", b"200 OK"], answers
    assert answers.endswith(b"ready\n")
    assert b"pipeline_metrics" not in answers  # HEAD: no body
    assert garbage.startswith(b"HTTP/1.1 400")
    assert too_big.startswith(b"HTTP/1.1 431")
    assert statuses == [200, 404]
