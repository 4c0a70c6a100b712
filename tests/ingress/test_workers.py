"""``pipeline ingress serve --workers N`` on real PostgreSQL and Redis.

Two workers share one port (SO_REUSEPORT) and one PostgreSQL log: both take connections, every
accepted webhook is one row and one event, their sweepers never produce a row twice, a worker
killed is started again, SIGTERM to the supervisor stops every worker and SIGUSR1 reaches every
worker. SQLite refuses ``--workers 2`` with one line.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import psutil
import pytest
from contract.helpers import consume_until
from ingress.helpers import meta_body, serve_until_listening
from ingress.signing import hub_signature
from ingress.supervised import Setup, workers_of, workers_setup
from redis.asyncio import Redis
from support import StackDumps
from tracing.otlp_receiver import OtlpReceiver

from pipeline.config import Settings
from pipeline.ingress import headers as h
from pipeline.ingress.ids import new_row_id
from pipeline.logstore import NewRow, RowState, Selection
from pipeline.logstore.postgres import PostgresLogStore
from pipeline.transport.redis_streams.keys import Keys

SECRET = "workers-secret"  # noqa: S105 - a test secret
PIPELINE = Path(sys.executable).with_name("pipeline")
UNSIGNED = {"content-type": "application/json", "x-hub-signature-256": "sha256=" + "0" * 64}


@pytest.fixture
async def setup(
    tmp_path: Path, settings: Settings, redis_service: str, postgres_service: str, unique: str
) -> AsyncIterator[Setup]:
    """A Redis topic and a PostgreSQL schema of the test's own, both removed after it."""
    async with workers_setup(
        tmp_path, settings, redis_service, postgres_service, unique, SECRET
    ) as made:
        yield made


def serve(
    env: dict[str, str], started: list[subprocess.Popen[str]], workers: int = 2
) -> tuple[subprocess.Popen[str], str]:
    """Start ``pipeline ingress serve --workers N --port 0``; its URL once all are listening."""
    return serve_until_listening(env, started, "--workers", str(workers), timeout_s=90)


def signed(body: bytes) -> bytes:
    """A raw HTTP/1.1 request posting ``body`` as a signed Meta delivery (keep-alive)."""
    head = (
        "POST /hooks/whatsapp HTTP/1.1\r\nhost: test\r\ncontent-type: application/json\r\n"
        f"x-hub-signature-256: {hub_signature(SECRET, body)}\r\n"
        f"content-length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


def post_on_own_connections(url: str, bodies: list[bytes]) -> list[tuple[int, int]]:
    """POST each body on a connection of its own, kept open; (client port, status) of each."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    conns = []
    answers = []
    try:
        for body in bodies:
            conn = socket.create_connection((host, int(port)), timeout=30)
            conns.append(conn)
            conn.sendall(signed(body))
        for conn in conns:
            head = b""
            while b"\r\n\r\n" not in head:
                chunk = conn.recv(4096)
                assert chunk, "connection closed before the answer"
                head += chunk
            answers.append((conn.getsockname()[1], int(head[9:12])))
        return answers
    finally:
        for conn in conns:
            conn.close()


def owners(workers: list[psutil.Process], client_ports: set[int]) -> Counter[int]:
    """How many of the open client connections each worker (by pid) holds the other end of."""
    held: Counter[int] = Counter()
    for worker in workers:
        for conn in worker.net_connections(kind="tcp"):
            if conn.raddr and conn.raddr.port in client_ports:
                held[worker.pid] += 1
    return held


async def wait_produced(schema: str, url: str, count: int) -> dict[RowState, int]:
    """The log's rows by state once ``count`` are produced (or after 60 s)."""
    store = PostgresLogStore(url, schema=schema)
    await store.open()
    try:
        deadline = time.monotonic() + 60
        while True:
            states = await store.count_by_state(Selection())
            if states.get(RowState.PRODUCED, 0) >= count or time.monotonic() > deadline:
                return states
            await asyncio.sleep(0.1)
    finally:
        await store.close()


async def test_two_workers_share_the_port_and_the_log(
    setup: Setup, settings: Settings, started: list[subprocess.Popen[str]]
) -> None:
    """Both workers take connections; each accepted webhook is one row and one event."""
    proc, url = serve(setup.env, started)
    workers = workers_of(proc)
    assert len(workers) == 2
    bodies = [meta_body(n) for n in range(40)]
    redelivered = bodies[:10]  # the same events again, most likely to the other worker
    host, port = url.removeprefix("http://").rsplit(":", 1)
    hold = [socket.create_connection((host, int(port))) for _ in range(40)]
    try:
        ports = {c.getsockname()[1] for c in hold}
        deadline = time.monotonic() + 30
        while sum((held := owners(workers, ports)).values()) < 40:  # until each is accepted
            assert time.monotonic() < deadline, held
            await asyncio.sleep(0.05)
        assert len(held) == 2, f"one worker took every connection: {held}"
    finally:
        for conn in hold:
            conn.close()
    answers = post_on_own_connections(url, bodies)
    assert [status for _, status in answers] == [200] * 40
    again = post_on_own_connections(url, redelivered)
    assert [status for _, status in again] == [200] * 10

    states = await wait_produced(setup.schema, settings.postgres.url, 40)
    assert states == {RowState.PRODUCED: 40}
    consumer = setup.transport.consumer(f"g-{uuid.uuid4().hex[:8]}", [setup.topic])
    got = await consume_until(consumer, lambda r: len(r) >= 40)
    await consumer.close()
    assert sorted(m.headers[h.EVENT_ID].decode() for m in got) == sorted(
        f"wamid.{n}" for n in range(40)
    )


async def test_workers_log_and_trace_as_the_command_asks(
    setup: Setup, started: list[subprocess.Popen[str]]
) -> None:
    """``PIPELINE_LOG_FORMAT`` and the ``OTEL_*`` variables reach the spawned workers.

    A worker is a new interpreter: configured only in the supervisor, every worker logged text
    and recorded no span.
    """
    receiver = OtlpReceiver()
    env = setup.env | {
        "PIPELINE_LOG_FORMAT": "json",
        "PIPELINE_LOG_LEVEL": "INFO",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": receiver.endpoint,
        "OTEL_TRACES_SAMPLER": "always_on",
        "OTEL_BSP_SCHEDULE_DELAY": "100",
    }
    try:
        proc, url = serve(env, started)
        assert [status for _, status in post_on_own_connections(url, [meta_body(0)])] == [200]
        async with httpx.AsyncClient() as http:  # a bad signature: the worker logs the rejection
            refused = await http.post(f"{url}/hooks/whatsapp", content=b"{}", headers=UNSIGNED)
        assert refused.status_code == 401
        deadline = time.monotonic() + 30
        while not any(
            span.name == "POST /hooks/whatsapp" and span.service == "pipeline-ingress"
            for span in receiver.spans
        ):
            assert time.monotonic() < deadline, "no request span from a worker"
            await asyncio.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=60)
    finally:
        receiver.close()
    records = [json.loads(line) for line in stderr.splitlines() if line.strip()]
    assert any(
        record["message"].startswith("webhook rejected from source whatsapp: ")
        for record in records
    )


async def test_sweepers_of_two_workers_produce_each_row_once(
    setup: Setup, settings: Settings, started: list[subprocess.Popen[str]], redis: Redis
) -> None:
    """Rows left unproduced are swept by both workers' sweepers, each row exactly once."""
    store = PostgresLogStore(settings.postgres.url, schema=setup.schema)
    await store.open()
    old_s = time.time() - 120
    rows = [
        NewRow(
            id=new_row_id(old_s),
            source="whatsapp",
            tenant="biz-1",
            key=f"wa-{n % 7}",
            topic=setup.topic,
            lane="messages",
            event_id=f"wamid.{n}",
            received_at_ms=int(old_s * 1000),
            headers={},
            body=meta_body(n),
        )
        for n in range(300)
    ]
    assert all(await asyncio.gather(*(store.insert(row) for row in rows)))
    await store.close()
    env = setup.env | {
        "PIPELINE_INGRESS__SWEEPER__ENABLED": "true",
        "PIPELINE_INGRESS__SWEEPER__INTERVAL_S": "0.05",
        "PIPELINE_INGRESS__SWEEPER__UNPRODUCED_AFTER_S": "1",
        "PIPELINE_INGRESS__SWEEPER__BATCH_SIZE": "10",
    }
    serve(env, started)

    states = await wait_produced(setup.schema, settings.postgres.url, 300)
    assert states == {RowState.PRODUCED: 300}
    keys = Keys(settings.redis.key_prefix)
    appended = [await redis.xlen(keys.stream(setup.topic, p)) for p in range(2)]
    assert sum(appended) == 300  # nothing produced twice
    consumer = setup.transport.consumer(f"g-{uuid.uuid4().hex[:8]}", [setup.topic])
    got = await consume_until(consumer, lambda r: len(r) >= 300)
    await consumer.close()
    ids = Counter(m.headers[h.EVENT_ID].decode() for m in got)
    assert ids == Counter({f"wamid.{n}": 1 for n in range(300)})


async def test_sigterm_stops_every_worker_and_a_dead_one_is_replaced(
    setup: Setup, started: list[subprocess.Popen[str]]
) -> None:
    """A killed worker is replaced, a second command on the port is refused, SIGTERM ends all."""
    proc, url = serve(setup.env, started)
    first = workers_of(proc)
    assert len(first) == 2
    first[0].kill()
    deadline = time.monotonic() + 90
    while {w.pid for w in workers_of(proc)} & {first[0].pid} or len(workers_of(proc)) < 2:
        assert time.monotonic() < deadline, "the dead worker was not replaced"
        await asyncio.sleep(0.1)
    replaced = workers_of(proc)
    second = await asyncio.create_subprocess_exec(  # another command on the port: refused
        PIPELINE,
        *("ingress", "serve", "--workers", "2", "--port", url.rsplit(":", 1)[1]),
        env=setup.env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    _, refused = await asyncio.wait_for(second.communicate(), 60)
    assert second.returncode == 2, refused
    assert b"cannot listen on" in refused
    async with httpx.AsyncClient(timeout=30) as http:  # still served, whichever worker answers
        for n in range(5):
            body = meta_body(n)
            headers = {"x-hub-signature-256": hub_signature(SECRET, body)}
            response = await http.post(f"{url}/hooks/whatsapp", content=body, headers=headers)
            assert response.status_code == 200, response.text

    everything = psutil.Process(proc.pid).children(recursive=True)  # with the resource tracker
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 0, stderr
    assert "starting it again" in stderr
    _, alive = psutil.wait_procs([*first, *replaced, *everything], timeout=10)
    assert alive == []


def test_sqlite_refuses_several_workers(tmp_path: Path) -> None:
    """SQLite with --workers 2: one line on stderr, exit 2, nothing started."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIPELINE_")}
    env["PIPELINE_INGRESS__SQLITE_PATH"] = str(tmp_path / "ingress.db")
    done = subprocess.run(
        [PIPELINE, "ingress", "serve", "--workers", "2", "--port", "0"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "--workers 2 needs the PostgreSQL log store" in lines[0]
    assert "PIPELINE_INGRESS__LOG_STORE=postgres" in lines[0]
    assert not (tmp_path / "ingress.db").exists()


async def test_sigusr1_to_the_supervisor_reaches_every_worker(
    setup: Setup, started: list[subprocess.Popen[str]]
) -> None:
    """Each listening worker writes its stacks; the supervisor and the workers go on."""
    proc, url = serve(setup.env, started)
    workers = {worker.pid for worker in workers_of(proc)}
    proc.send_signal(signal.SIGUSR1)
    assert proc.stderr is not None
    dumps = StackDumps()
    while set(dumps.whole) != workers:  # each worker's whole dump, one after the other
        line = proc.stderr.readline()
        assert line, f"the ingress exited after SIGUSR1 (dumped: {dumps.whole})"
        dumps.read(line)
        assert set(dumps.whole) <= workers, line  # never the supervisor's own
    assert dumps.whole == dict.fromkeys(workers, 1)
    async with httpx.AsyncClient(timeout=10) as client:  # still serving
        assert (await client.get(f"{url}/hooks/none")).status_code == 404
    assert {worker.pid for worker in workers_of(proc)} == workers
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=60)
    assert proc.returncode == 0
