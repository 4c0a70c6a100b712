"""Hostile-input benchmark: what each door costs when attacked (docs/ingress.md, docs/registry.md).

Run: ``make bench-hostile`` (= ``.venv/bin/python bench/hostile.py``). Needs Redis (the ingress's
transport) and PostgreSQL (for the bad-neighbour run on both log stores). Servers run as
subprocesses on loopback with the project's settings (``pipeline ingress serve``,
``pipeline registry serve``), measured with psutil:

* ``signed_p99_ms_under_slowloris``: open-loop signed Meta deliveries at 100/s for 5 s while 600
  sockets hold a request whose body never comes (headers and one byte; the default
  ``max_in_flight`` is 512); latency from each request's intended send time;
* ``rss_growth_mb_big_header``: the ingress's peak RSS growth while one client sends a 200 MiB
  header;
* ``rss_growth_mb_registry_big_body``: the registry's peak RSS growth while a client with a
  300 MiB body sends it (declared ``Content-Length`` and chunked, the larger of the two);
* ``compat_ms_depth_30``: one BACKWARD check of the doubling schema (two references to the
  level below, per level) at depth 30, in process;
* ``good_requests_failed_by_bad_neighbour``: of 300 good requests sent concurrently with 100
  whose tenant is a lone surrogate or holds NUL, how many were not answered 200, SQLite and
  PostgreSQL together.

The last line of output is one JSON object.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import common
import psutil
import psycopg
import uvloop
from ingress import (
    drop_topic,
    free_port,
    load,
    requests,
    setup_topic,
    start_ingress,
    stop,
    wait_listening,
)

from pipeline.config import Compatibility, load_settings
from pipeline.registry.canonical import parse
from pipeline.registry.compat import check

MIB = 1_048_576


def write_config(workdir: Path, topic: str) -> None:
    """Topics and sources: ``bench`` (signed Meta) and ``plain`` (unsigned, tenant from body)."""
    sources = {
        "bench": common.meta_source(topic, key=False),
        "plain": {"scheme": "none", "tenant": {"pointer": "/tenant"}, "topic": topic},
    }
    common.write_config(workdir, [{"name": topic, "partitions": 4, "lane": "bench"}], sources)


class PeakRss:
    """Samples a process's RSS every 10 ms on a thread; ``growth_mb`` is peak minus start."""

    def __init__(self, pid: int) -> None:
        """Start sampling ``pid``."""
        self._process = psutil.Process(pid)
        self.start = self._process.memory_info().rss
        self.peak = self.start
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._done.wait(0.01):
            try:
                self.peak = max(self.peak, self._process.memory_info().rss)
            except psutil.Error:
                return

    def growth_mb(self) -> float:
        """Stop sampling; the peak growth in MB."""
        self._done.set()
        self._thread.join()
        return (self.peak - self.start) / 1e6


async def send_until_closed(port: int, head: bytes, chunks: int, chunk: bytes) -> bytes:
    """Send ``head`` then up to ``chunks`` copies of ``chunk``; stop when the server answers."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    answer = b""
    try:
        writer.write(head)
        for _ in range(chunks):
            writer.write(chunk)
            try:
                await asyncio.wait_for(writer.drain(), 5)
            except (ConnectionError, TimeoutError):
                break
            if reader.at_eof() or reader._buffer:  # noqa: SLF001 - an answer arrived
                break
        try:
            answer = await asyncio.wait_for(reader.read(4096), 30)
        except (ConnectionError, TimeoutError):
            answer = b""
    finally:
        writer.close()
    return answer


def big_header(workdir: Path) -> float:
    """Peak RSS growth of the ingress while one 200 MiB header is sent."""
    proc, port = start_ingress(workdir)
    try:
        rss = PeakRss(proc.pid)
        head = b"POST /hooks/bench HTTP/1.1\r\nHost: bench\r\nX-Big: "
        answer = uvloop.run(send_until_closed(port, head, 200, b"a" * MIB))
        growth = rss.growth_mb()
    finally:
        stop(proc)
    print(f"  200 MiB header: answer {answer[:12]!r}, RSS +{growth:.1f} MB", flush=True)
    return growth


async def slowloris_p99(port: int, sockets: int, rate: int, seconds: int) -> tuple[float, int]:
    """p99 (ms) and accepted count of signed requests at ``rate`` with ``sockets`` idle bodies."""
    idle = []
    head = (
        b"POST /hooks/bench HTTP/1.1\r\nHost: bench\r\ncontent-type: application/json\r\n"
        b"content-length: 1024\r\n\r\n{"
    )
    for _ in range(sockets):
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(head)
        idle.append(writer)
    await asyncio.gather(*(w.drain() for w in idle))
    try:
        # Connections are served in order: once these are answered, every idle one is in.
        await load(port, requests(64, f"settle-{uuid.uuid4().hex[:6]}"), None)
        raw = requests(rate * seconds, f"slow-{uuid.uuid4().hex[:6]}")
        accepted, _, latencies = await load(port, raw, rate)
    finally:
        for writer in idle:
            writer.close()
    latencies.sort()
    return common.percentile(latencies, 99) * 1000, accepted


def slowloris(workdir: Path) -> tuple[float, float]:
    """p99 of signed requests at 100/s without, then with 600 sockets holding idle bodies."""
    proc, port = start_ingress(workdir)
    try:
        uvloop.run(load(port, requests(200, f"warm-{uuid.uuid4().hex[:6]}"), None))
        calm, calm_accepted = uvloop.run(slowloris_p99(port, 0, 100, 5))
        p99, accepted = uvloop.run(slowloris_p99(port, 600, 100, 5))
    finally:
        stop(proc)
    print(f"  100/s signed, no attack: {calm_accepted}/500 accepted, p99 {calm:.1f} ms")
    print(f"  100/s signed under 600 idle bodies: {accepted}/500 accepted, p99 {p99:.1f} ms")
    return calm, p99


async def neighbours(port: int) -> int:
    """Good requests not answered 200 when sent together with bad ones."""
    bodies = []
    for n in range(400):
        tenant = ("\ud800" if n % 2 else "nul\x00") if n % 4 == 0 else f"good-{n}"
        bodies.append((n % 4 != 0, json.dumps({"tenant": tenant, "n": n}).encode()))

    async def send(body: bytes) -> int:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(
                b"POST /hooks/plain HTTP/1.1\r\nHost: bench\r\ncontent-length: %d\r\n\r\n%s"
                % (len(body), body)
            )
            head = await reader.readuntil(b"\r\n\r\n")
            return int(head[9:12])
        finally:
            writer.close()

    statuses = await asyncio.gather(*(send(body) for _, body in bodies))
    return sum(
        1 for (good, _), status in zip(bodies, statuses, strict=True) if good and status != 200
    )


def bad_neighbours(workdir: Path) -> int:
    """Good requests failed by bad ones, on SQLite and on PostgreSQL."""
    failed = 0
    url = load_settings().postgres.url
    schema = f"bench_{uuid.uuid4().hex[:10]}"
    for extra in (
        {},
        {"PIPELINE_INGRESS__LOG_STORE": "postgres", "PIPELINE_INGRESS__POSTGRES_SCHEMA": schema},
    ):
        proc, port = start_ingress(workdir, **extra)
        try:
            lost = uvloop.run(neighbours(port))
        finally:
            stop(proc)
        print(f"  {extra.get('PIPELINE_INGRESS__LOG_STORE', 'sqlite')}: {lost} of 300 good failed")
        failed += lost
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    return failed


def registry_big_body(workdir: Path) -> float:
    """Peak RSS growth of the registry while 300 MiB bodies are sent (declared, chunked)."""
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pipeline",
            "registry",
            "serve",
            "--port",
            str(port),
            "--store",
            f"sqlite:///{workdir / 'registry.db'}",
        ],
        stdout=subprocess.DEVNULL,
    )
    wait_listening(port, proc)
    growths = []
    try:
        for framing in (b"content-length: %d\r\n" % (300 * MIB), b"transfer-encoding: chunked\r\n"):
            rss = PeakRss(proc.pid)
            head = b"POST /subjects/big/versions HTTP/1.1\r\nHost: r\r\n" + framing + b"\r\n"
            chunk = b"a" * MIB
            if b"chunked" in framing:
                chunk = b"%x\r\n%s\r\n" % (MIB, chunk)
            answer = uvloop.run(send_until_closed(port, head, 300, chunk))
            growths.append(rss.growth_mb())
            print(
                f"  registry 300 MiB body ({framing.split(b':')[0].decode()}): "
                f"answer {answer[:12]!r}, RSS +{growths[-1]:.1f} MB",
                flush=True,
            )
    finally:
        stop(proc)
    return max(growths)


def doubling(depth: int, leaf: str) -> str:
    """Records L0..L<depth>, each with two fields of the level below (the second by name)."""
    schema: Any = {"type": "record", "name": "L0", "fields": [{"name": "v", "type": leaf}]}
    for level in range(1, depth + 1):
        schema = {
            "type": "record",
            "name": f"L{level}",
            "fields": [{"name": "a", "type": schema}, {"name": "b", "type": f"L{level - 1}"}],
        }
    return json.dumps(schema)


def compat_ms(depth: int) -> float:
    """Milliseconds of one BACKWARD check of the doubling schema at ``depth`` (best of 5)."""
    old, new = parse(doubling(depth, "int")), parse(doubling(depth, "long"))
    best = float("inf")
    for _ in range(5):
        started = time.perf_counter()
        problems = check(new, [(1, old)], Compatibility.BACKWARD)
        best = min(best, time.perf_counter() - started)
        if problems:
            raise SystemExit(f"the widened schema was refused: {problems}")
    print(f"  compatibility check, doubling schema depth {depth}: {best * 1000:.2f} ms")
    return best * 1000


def main() -> None:
    topic = f"bench_hostile_{uuid.uuid4().hex[:8]}"
    with tempfile.TemporaryDirectory(prefix="bench-hostile-") as tmp:
        workdir = Path(tmp)
        write_config(workdir, topic)
        asyncio.run(setup_topic(topic))
        try:
            calm, attacked = slowloris(workdir)
            result = {
                "bench": "hostile",
                "signed_p99_ms_under_slowloris": round(attacked, 1),
                "signed_p99_ms_no_attack": round(calm, 1),
                "rss_growth_mb_big_header": round(big_header(workdir), 1),
                "rss_growth_mb_registry_big_body": round(registry_big_body(workdir), 1),
                "compat_ms_depth_30": round(compat_ms(30), 2),
                "good_requests_failed_by_bad_neighbour": bad_neighbours(workdir),
            }
        finally:
            asyncio.run(drop_topic(topic))
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
