"""Ingress benchmark: durable accepts/s, vs durability off, vs a naive endpoint; p99 at 1k/s.

Run: ``make bench-ingress`` (= ``.venv/bin/python bench/ingress.py``). Needs Redis (the embedded
default transport; ``PIPELINE_REDIS__URL``) and PostgreSQL (``PIPELINE_POSTGRES__URL``, for the
scale-out figure). Method and results: ``docs/ingress.md``.

Servers run as subprocesses on loopback, each on uvicorn with uvloop and httptools:

* **durable**: ``pipeline ingress serve`` with SQLite ``synchronous=FULL`` (WAL fsync per group
  commit) producing every event to Redis Streams;
* **nondurable**: the same ingress with ``synchronous=OFF`` (no fsync at all);
* **naive**: a FastAPI endpoint that verifies the same signature and commits one SQLite row per
  request (WAL, ``synchronous=FULL``), with no produce at all;
* **postgres x1 / x2**: ``pipeline ingress serve --workers 1`` and ``--workers 2`` on the
  PostgreSQL log store (a schema of its own per run, dropped after), producing every event;
  ``pg_scale_2_workers`` is the ratio of their accepts/s. ``pg_cores_busy_<n>_worker(s)`` is how
  many of the machine's ``cores`` were busy meanwhile (every process: the workers, PostgreSQL,
  Redis, the load generator), which bounds what a second worker can add on this host:
  ``pg_scale_bound`` = ``cores`` ÷ ``pg_cores_busy_1_worker``, the most any number of workers
  could scale if each accept cost every process what it cost at one worker.

The load generator is open-loop: every request has an intended send time, and latency is
measured from that time (so queueing in the client counts, no coordinated omission). Requests
are pre-signed Meta deliveries with 1 KiB JSON bodies and distinct event ids, sent over 64
keep-alive HTTP/1.1 connections. The last line of output is one JSON object.

A fourth server, **traced**, is the durable one with tracing on at 100 % sampling, exporting to
a sink process (``bench/tracing_parts.py``): ``tracing_overhead`` = traced ÷ durable accepts/s,
``tracing_off_overhead`` = 1 - the tracing hooks' time per request (tracing off) ÷ the durable
server's CPU per request; ``tracing_export_us_per_request`` the exporting process's encoding of
one accepted webhook's spans (request, stages, send), ``tracing_export_sdk_us_per_request`` the
SDK's for the same records.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import hashlib
import hmac
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import common
import psutil
import uvloop
from redis.asyncio import Redis
from tracing_parts import (
    ingress_hooks_s,
    off_overhead,
    otlp_sink,
    request_export_encode_s,
    traced_env,
)

from pipeline.testing.ports import free_port

SECRET = "bench-secret"  # noqa: S105 - the benchmark's own signing key
CONNECTIONS = 64
_CONTENT_LENGTH = re.compile(rb"content-length: *(\d+)", re.IGNORECASE)


def body_of(n: int, run: str) -> bytes:
    """A 1 KiB Meta-like JSON body with a distinct event id."""
    doc = {
        "object": "whatsapp_business_account",
        "entry": [
            {
                "id": f"biz-{n % 50}",
                "changes": [
                    {
                        "field": "messages",
                        "value": {
                            "contacts": [{"wa_id": f"wa-{n % 1000}"}],
                            "messages": [{"id": f"wamid.{run}.{n}", "text": {"body": ""}}],
                        },
                    }
                ],
            }
        ],
    }
    raw = json.dumps(doc)
    doc["entry"][0]["changes"][0]["value"]["messages"][0]["text"]["body"] = "x" * (1024 - len(raw))
    return json.dumps(doc).encode()


def requests(count: int, run: str, path: str = "/hooks/bench") -> list[bytes]:
    """``count`` pre-signed raw HTTP requests."""
    out = []
    for n in range(count):
        body = body_of(n, run)
        signature = hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()
        head = (
            f"POST {path} HTTP/1.1\r\nhost: bench\r\ncontent-type: application/json\r\n"
            f"x-hub-signature-256: sha256={signature}\r\ncontent-length: {len(body)}\r\n\r\n"
        )
        out.append(head.encode() + body)
    return out


async def load(
    port: int, raw: list[bytes], rate_per_s: float | None
) -> tuple[int, float, list[float]]:
    """Send ``raw`` open-loop at ``rate_per_s`` (None: at once): accepted, seconds, latencies."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[float, bytes] | None] = asyncio.Queue()
    latencies: list[float] = []
    accepted = 0
    start = loop.time() + 0.05
    for i, request in enumerate(raw):
        queue.put_nowait((start + (i / rate_per_s if rate_per_s else 0.0), request))

    async def worker() -> None:
        nonlocal accepted
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            while True:
                try:
                    item = queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                if item is None:
                    return
                intended, request = item
                delay = intended - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                writer.write(request)
                head = await reader.readuntil(b"\r\n\r\n")
                match = _CONTENT_LENGTH.search(head)
                await reader.readexactly(int(match[1]) if match else 0)
                latencies.append(loop.time() - intended)
                if head[9:12] == b"200":
                    accepted += 1
        finally:
            writer.close()

    await asyncio.gather(*(worker() for _ in range(CONNECTIONS)))
    return accepted, loop.time() - start, latencies


@contextlib.contextmanager
def collector_off() -> Iterator[None]:
    """The sender's own cyclic collector, off while it sends paced load (as ``timeit`` does).

    One of its full passes over the prepared requests stalled every send for about 40 ms, which
    the latencies would charge to the server. It collects once on entry, before the schedule's
    clock is read.
    """
    collecting = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()


def port_open(port: int, timeout_s: float = 0.5) -> bool:
    """Whether something accepts connections on the loopback ``port``."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout_s):
            return True
    except OSError:
        return False


def wait_listening(port: int, proc: subprocess.Popen[bytes], timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server exited with {proc.returncode}")
        if port_open(port, timeout_s=0.2):
            return
        time.sleep(0.05)
    raise SystemExit(f"server on port {port} did not start")


def start_ingress(
    workdir: Path,
    synchronous: str = "FULL",
    transport: str = "redis",
    traces_to: str | None = None,
    **extra: str,
) -> tuple[subprocess.Popen[bytes], int]:
    """``pipeline ingress serve`` on a free port, without its sweeper; ``extra`` adds variables."""
    port = free_port()
    db = workdir / f"ingress-{synchronous}-{uuid.uuid4().hex[:6]}.db"
    env = {
        **os.environ,
        "PIPELINE_BENCH_SECRET": SECRET,
        "PIPELINE_TRANSPORT": transport,
        "PIPELINE_TOPICS_DIR": str(workdir / "topics"),
        "PIPELINE_INGRESS__SOURCES_FILE": str(workdir / "sources.yaml"),
        "PIPELINE_INGRESS__SQLITE_PATH": str(db),
        "PIPELINE_INGRESS__SQLITE_SYNCHRONOUS": synchronous,
        "PIPELINE_INGRESS__SWEEPER__ENABLED": "false",
        **(traced_env(traces_to) if traces_to else {}),
        **extra,
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "pipeline.ingress.cli", "ingress", "serve", "--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
    )
    wait_listening(port, proc)
    return proc, port


def start_pg_ingress(
    workdir: Path, workers: int, schema: str
) -> tuple[subprocess.Popen[bytes], int]:
    """``pipeline ingress serve --workers N`` on the PostgreSQL log store (schema ``schema``)."""
    port = free_port()
    env = {
        **os.environ,
        "PIPELINE_BENCH_SECRET": SECRET,
        "PIPELINE_TRANSPORT": "redis",
        "PIPELINE_TOPICS_DIR": str(workdir / "topics"),
        "PIPELINE_INGRESS__SOURCES_FILE": str(workdir / "sources.yaml"),
        "PIPELINE_INGRESS__LOG_STORE": "postgres",
        "PIPELINE_INGRESS__POSTGRES_SCHEMA": schema,
        "PIPELINE_INGRESS__SWEEPER__ENABLED": "false",
    }
    command = [sys.executable, "-m", "pipeline.ingress.cli", "ingress", "serve"]
    proc = subprocess.Popen(
        [*command, "--port", str(port), "--workers", str(workers)],
        env=env,
        stdout=subprocess.PIPE,
    )
    line = proc.stdout.readline() if proc.stdout is not None else b""  # once every worker listens
    if not line.startswith(b"ingress listening on "):
        proc.wait()
        raise SystemExit(f"PostgreSQL ingress with {workers} workers exited {proc.returncode}")
    return proc, port


def cpu_s_tree(proc: subprocess.Popen[bytes]) -> float:
    """CPU seconds of ``proc`` and its children (the workers)."""
    procs = [psutil.Process(proc.pid)]
    procs += procs[0].children(recursive=True)
    return sum(float(t.user + t.system) for t in (p.cpu_times() for p in procs))


async def drop_schema(schema: str) -> None:
    """Remove a PostgreSQL run's log schema."""
    import psycopg  # noqa: PLC0415

    from pipeline.config import load_settings  # noqa: PLC0415

    url = load_settings().postgres.url
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def machine_busy_s() -> float:
    """CPU seconds the whole machine has spent busy (every process, the kernel's interrupts)."""
    t = psutil.cpu_times()
    return float(t.user + t.nice + t.system + t.irq + t.softirq)


def measure_pg(workdir: Path, workers: int, count: int, run: str) -> tuple[float, float]:
    """(accepts/s, cores the machine kept busy) at saturation on PostgreSQL, ``workers`` processes.

    The busy cores count everything on the machine during the load: the ingress processes,
    PostgreSQL, Redis and this load generator. When one worker already keeps most of them
    busy, a second has no core to add.
    """
    schema = f"bench_{uuid.uuid4().hex[:10]}"
    try:
        proc, port = start_pg_ingress(workdir, workers, schema)
        try:
            uvloop.run(load(port, requests(500, f"warm-{run}"), None))
            before, busy_before = cpu_s_tree(proc), machine_busy_s()
            accepted, seconds, _ = uvloop.run(load(port, requests(count, run), None))
            used, busy = cpu_s_tree(proc) - before, machine_busy_s() - busy_before
        finally:
            stop(proc)
    finally:
        asyncio.run(drop_schema(schema))
    rps = accepted / seconds
    cores = busy / seconds
    print(
        f"  postgres x{workers} {rps:>7.0f} accepts/s  "
        f"({used / max(accepted, 1) * 10_000:.2f} cpu-s/10k; the machine kept {cores:.2f} of"
        f" {psutil.cpu_count()} cores busy, the ingress {used / seconds:.2f})",
        flush=True,
    )
    return rps, cores


NAIVE_APP = """
import hashlib, hmac, sqlite3, sys, uuid
from fastapi import FastAPI, Request, Response
db = sqlite3.connect(sys.argv[1], check_same_thread=False, isolation_level=None)
db.execute("PRAGMA journal_mode=WAL"); db.execute("PRAGMA synchronous=FULL")
db.execute("CREATE TABLE IF NOT EXISTS log (id TEXT PRIMARY KEY, body BLOB, event TEXT UNIQUE)")
app = FastAPI()
@app.post("/hooks/bench")
async def hook(request: Request) -> Response:
    body = await request.body()
    expected = "sha256=" + hmac.new(b"SECRET", body, hashlib.sha256).hexdigest()
    if not hmac.compare_digest(expected, request.headers.get("x-hub-signature-256", "")):
        return Response(status_code=401)
    db.execute("BEGIN")
    row = (uuid.uuid4().hex, body, uuid.uuid4().hex)
    db.execute("INSERT OR IGNORE INTO log VALUES (?, ?, ?)", row)
    db.execute("COMMIT")
    return Response('{"status":"accepted"}', media_type="application/json")
"""


def start_naive(workdir: Path) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    app_file = workdir / "naive_app.py"
    app_file.write_text(NAIVE_APP.replace("SECRET", SECRET), encoding="utf-8")
    db = workdir / f"naive-{uuid.uuid4().hex[:6]}.db"
    code = (
        "import sys, uvicorn; sys.argv=['naive', sys.argv[1]]; sys.path.insert(0, sys.argv[0]);"
        f"import runpy; ns = runpy.run_path({str(app_file)!r});"
        f"uvicorn.run(ns['app'], host='127.0.0.1', port={port}, loop='uvloop', http='httptools',"
        " log_level='warning', access_log=False)"
    )
    proc = subprocess.Popen([sys.executable, "-c", code, str(db)], stdout=subprocess.DEVNULL)
    wait_listening(port, proc)
    return proc, port


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def cpu_s(proc: subprocess.Popen[bytes]) -> float:
    times = psutil.Process(proc.pid).cpu_times()
    return float(times.user + times.system)


async def setup_topic(topic: str) -> None:
    from pipeline.config import load_settings  # noqa: PLC0415
    from pipeline.transport import create_transport  # noqa: PLC0415
    from pipeline.transport.protocol import TopicConfig  # noqa: PLC0415

    transport = create_transport(load_settings(), "redis")
    try:
        await transport.admin().create_topic(TopicConfig(topic, 4, max_len=20_000))
    finally:
        await transport.close()


async def drop_topic(topic: str) -> None:
    from pipeline.config import load_settings  # noqa: PLC0415
    from pipeline.transport import create_transport  # noqa: PLC0415

    transport = create_transport(load_settings(), "redis")
    try:
        await transport.admin().delete_topic(topic)
    finally:
        await transport.close()


async def produced(topic: str) -> int:
    """Events produced to ``topic`` so far: the sum of its partitions' offset counters."""
    from pipeline.config import load_settings  # noqa: PLC0415
    from pipeline.transport.redis_streams.keys import Keys  # noqa: PLC0415

    settings = load_settings()
    keys = Keys(settings.redis.key_prefix)
    client = Redis.from_url(settings.redis.url)
    try:
        counts = [await client.get(keys.sequence(topic, p)) for p in range(4)]
    finally:
        await client.aclose()
    return sum(int(c or 0) for c in counts)


def check_produced(topic: str, before: int, accepted: int, kind: str) -> None:
    """Fail the run unless every accepted webhook was produced (within 30 s of the load).

    A server whose produce fails answers as fast or faster, so its figure would be a lie.
    """
    deadline = time.monotonic() + 30
    while (done := asyncio.run(produced(topic)) - before) < accepted:
        if time.monotonic() > deadline:
            raise SystemExit(f"{kind}: {done} of {accepted} accepted webhooks were produced")
        time.sleep(0.2)


def measure_max(
    kind: str,
    workdir: Path,
    count: int,
    run: str,
    traces_to: str | None = None,
    topic: str | None = None,
) -> tuple[float, float]:
    """(accepts/s, server CPU seconds per 10k accepts) at saturation.

    With ``topic``, the run fails unless every accepted webhook reached it.
    """
    if kind == "naive":
        proc, port = start_naive(workdir)
    elif kind == "traced":
        proc, port = start_ingress(workdir, "FULL", traces_to=traces_to)
    else:
        proc, port = start_ingress(workdir, "FULL" if kind == "durable" else "OFF")
    try:
        uvloop.run(load(port, requests(500, f"warm-{run}"), None))
        raw = requests(count, run)
        events = asyncio.run(produced(topic)) if topic else 0
        before = cpu_s(proc)
        accepted, seconds, _ = uvloop.run(load(port, raw, None))
        used = cpu_s(proc) - before
        if topic:
            check_produced(topic, events, accepted, kind)
    finally:
        stop(proc)
    if accepted < count:
        print(f"  {kind}: only {accepted}/{count} accepted", flush=True)
    rps = accepted / seconds
    print(
        f"  {kind:<11} {rps:>8.0f} accepts/s  ({used / max(accepted, 1) * 10_000:.2f} cpu-s/10k)",
        flush=True,
    )
    return rps, used / max(accepted, 1) * 10_000


SLOW_COMMIT_S = 0.02
"""A group commit slower than this is counted as slow in the paced run's commit figures."""


def commit_buckets(port: int, after: float) -> dict[float, float]:
    """The server's ``pipeline_log_commit_duration_seconds`` buckets (upper bound: count).

    Read from its ``/metrics`` once that snapshot was refreshed after ``after`` (Unix time);
    the snapshot refreshes every 15 s.
    """
    deadline = time.monotonic() + 40
    pattern = re.compile(r'^pipeline_log_commit_duration_seconds_bucket\{le="([^"]+)"\} (\S+)$')
    while True:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
            text = answer.read().decode()
        stamp = re.search(r"^pipeline_metrics_refresh_timestamp_seconds (\S+)$", text, re.MULTILINE)
        if (stamp and float(stamp[1]) >= after) or time.monotonic() > deadline:
            break
        time.sleep(0.25)
    buckets: dict[float, float] = {}
    for line in text.splitlines():
        if match := pattern.match(line):
            buckets[float(match[1])] = float(match[2])
    return buckets


def commit_figures(
    before: dict[float, float], after: dict[float, float]
) -> dict[str, float | None]:
    """The commits between two readings: how many, the bucket holding their p99 (0: none), how
    many were slow, and the bucket holding the slowest (None: beyond the last bound)."""
    counts = {le: after[le] - before.get(le, 0.0) for le in sorted(after)}
    total = counts.get(float("inf"), 0.0)
    p99_s = next((le for le, n in counts.items() if total and n >= 0.99 * total), 0.0)
    fast = max((n for le, n in counts.items() if le <= SLOW_COMMIT_S), default=0.0)
    below, slowest_s = 0.0, 0.0
    for le, n in counts.items():  # cumulative: the last bucket that gained is the slowest's
        if n > below:
            below, slowest_s = n, le
    return {
        "commits": total,
        "commit_p99_le_ms": p99_s * 1000,
        "slow_commits": total - fast,
        "slowest_commit_le_ms": slowest_s * 1000 if slowest_s != float("inf") else None,
    }


def measure_p99(workdir: Path, rate: int, seconds: int) -> tuple[float, dict[str, Any]]:
    """The paced run's p99 (ms), and its group commits read from the server's metrics."""
    proc, port = start_ingress(workdir, "FULL")
    try:
        uvloop.run(load(port, requests(500, "warm-p99"), None))
        raw = requests(rate * seconds, "p99")
        before = commit_buckets(port, time.time())
        with collector_off():
            accepted, _, latencies = uvloop.run(load(port, raw, rate))
        commits = commit_figures(before, commit_buckets(port, time.time()))
    finally:
        stop(proc)
    p50 = statistics.quantiles(latencies, n=100)[49] * 1000
    p99 = statistics.quantiles(latencies, n=100)[98] * 1000
    print(
        f"  open loop {rate}/s for {seconds}s: {accepted} accepted, p50 {p50:.1f} ms, "
        f"p99 {p99:.1f} ms; {commits['commits']:.0f} group commits, p99 within "
        f"{commits['commit_p99_le_ms']:g} ms, {commits['slow_commits']:.0f} over "
        f"{SLOW_COMMIT_S * 1000:g} ms, the slowest within {commits['slowest_commit_le_ms']} ms",
        flush=True,
    )
    return p99, commits


def write_config(workdir: Path, topic: str) -> dict[str, Any]:
    """Write the ingress's ``topics/bench.yaml`` and ``sources.yaml``; returns the lane's doc."""
    spec_doc = {"name": topic, "partitions": 4, "lane": "bench"}
    common.write_config(workdir, [spec_doc], {"bench": common.meta_source(topic)})
    return spec_doc


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=15_000, help="per saturation run")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds")
    parser.add_argument("--p99-seconds", type=int, default=10)
    args = parser.parse_args()
    topic = f"bench_ingress_{uuid.uuid4().hex[:8]}"
    with tempfile.TemporaryDirectory(prefix="bench-ingress-") as tmp:
        workdir = Path(tmp)
        write_config(workdir, topic)
        asyncio.run(setup_topic(topic))
        try:
            results: dict[str, list[tuple[float, float]]] = {
                "durable": [],
                "nondurable": [],
                "naive": [],
                "traced": [],
            }
            with otlp_sink() as endpoint:
                for r in range(args.rounds):
                    print(
                        f"round {r + 1}/{args.rounds} ({args.requests} requests each)", flush=True
                    )
                    for kind, runs in results.items():
                        runs.append(
                            measure_max(
                                kind,
                                workdir,
                                args.requests,
                                f"{kind}{r}",
                                endpoint,
                                None if kind == "naive" else topic,
                            )
                        )
            p99, commits = measure_p99(workdir, 1_000, args.p99_seconds)
            scale: dict[int, list[float]] = {1: [], 2: []}
            busy: dict[int, list[float]] = {1: [], 2: []}
            for r in range(args.rounds):
                print(f"postgres round {r + 1}/{args.rounds}", flush=True)
                for workers, runs_pg in scale.items():
                    rps, cores = measure_pg(workdir, workers, args.requests, f"pg{workers}-{r}")
                    runs_pg.append(rps)
                    busy[workers].append(cores)
        finally:
            asyncio.run(drop_topic(topic))
    med = {kind: statistics.median(rps for rps, _ in runs) for kind, runs in results.items()}
    export_s, export_sdk_s = request_export_encode_s()
    cpu = statistics.median(c for _, c in results["durable"])
    print(
        json.dumps(
            {
                "bench": "ingress",
                "durable_vs_nondurable": round(med["durable"] / med["nondurable"], 2),
                "vs_naive": round(med["durable"] / med["naive"], 2),
                "p99_ms_at_1k": round(p99, 1),
                "commit_p99_le_ms_at_1k": commits["commit_p99_le_ms"],
                "slow_commits_at_1k": int(commits["slow_commits"]),
                "commits_at_1k": int(commits["commits"]),
                "slowest_commit_le_ms_at_1k": commits["slowest_commit_le_ms"],
                "max_durable_rps": round(med["durable"]),
                "cpu_s_per_10k": round(cpu, 2),
                "pg_scale_2_workers": round(
                    statistics.median(scale[2]) / statistics.median(scale[1]), 2
                ),
                "pg_rps_1_worker": round(statistics.median(scale[1])),
                "pg_rps_2_workers": round(statistics.median(scale[2])),
                "pg_cores_busy_1_worker": round(statistics.median(busy[1]), 2),
                "pg_cores_busy_2_workers": round(statistics.median(busy[2]), 2),
                "cores": psutil.cpu_count(),
                "pg_scale_bound": round((psutil.cpu_count() or 1) / statistics.median(busy[1]), 2),
                "tracing_overhead": round(
                    statistics.median(
                        t / d
                        for (t, _), (d, _) in zip(
                            results["traced"], results["durable"], strict=True
                        )
                    ),
                    3,
                ),
                "tracing_off_overhead": round(off_overhead(ingress_hooks_s(), cpu / 10_000), 4),
                "traced_rps": round(med["traced"]),
                "tracing_export_us_per_request": round(export_s * 1e6, 2),
                "tracing_export_sdk_us_per_request": round(export_sdk_s * 1e6, 1),
            }
        )
    )


if __name__ == "__main__":
    main()
