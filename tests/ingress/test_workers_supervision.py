"""``pipeline ingress serve --workers N``: what the supervisor tells operators, and its stop.

Real PostgreSQL and Redis. A scrape of ``/metrics`` must not jump between the workers' counters
(each scrape one worker's share: a counter that goes down is read as a restart, and rates
multiply), and a second SIGINT or SIGTERM to the supervisor reaches the workers as it reaches a
single ingress.
"""

from __future__ import annotations

import multiprocessing
import re
import signal
import socket
import subprocess
import threading
import time
from collections.abc import AsyncIterator
from multiprocessing.connection import Connection
from pathlib import Path

import httpx
import pytest
from ingress.helpers import meta_body, serve_until_listening
from ingress.signing import hub_signature
from ingress.supervised import Setup, workers_setup

from pipeline.config import Settings
from pipeline.ingress.workers import Supervisor, WorkerArgs, _Worker

SECRET = "supervision-secret"  # noqa: S105 - a test secret


@pytest.fixture
async def setup(
    tmp_path: Path, settings: Settings, redis_service: str, postgres_service: str, unique: str
) -> AsyncIterator[Setup]:
    """A Redis topic and a PostgreSQL schema of the test's own, both removed after it."""
    async with workers_setup(
        tmp_path, settings, redis_service, postgres_service, unique, SECRET
    ) as made:
        yield made


def accepted_count(text: str) -> float:
    """The sum of the ``pipeline_ingress_requests_total`` samples of a scrape."""
    return sum(
        float(m.group(1))
        for m in re.finditer(
            r"^pipeline_ingress_requests_total\{[^}]*\} (\S+)$", text, re.MULTILINE
        )
    )


def free_ports(count: int) -> int:
    """The first of ``count`` consecutive ports free on 127.0.0.1 (a metrics port P, P + 1...)."""
    for _ in range(50):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            first = probe.getsockname()[1]
        if first + count > 65535:
            continue
        held = []
        try:
            for port in range(first, first + count):
                sock = socket.socket()
                held.append(sock)
                sock.bind(("127.0.0.1", port))
        except OSError:
            continue
        finally:
            for sock in held:
                sock.close()
        return first
    raise AssertionError("no consecutive free ports")


def post_signed(url: str, numbers: range) -> None:
    """POST a signed Meta delivery of each number, each on a connection of its own."""
    for n in numbers:
        body = meta_body(n)
        headers = {"x-hub-signature-256": hub_signature(SECRET, body)}
        with httpx.Client(timeout=30) as http:
            assert (
                http.post(f"{url}/hooks/whatsapp", content=body, headers=headers).status_code == 200
            )


def test_the_webhook_port_serves_no_metrics_of_one_worker(
    setup: Setup, started: list[subprocess.Popen[str]]
) -> None:
    """Without a metrics port, /metrics on the webhook port is 404 and says why; health stays.

    Each scrape went to whichever worker the kernel gave its connection: 20 webhooks on one
    connection were read as 20, then 0, then 20 again (a counter that drops is a restart to
    Prometheus, so its rates multiplied).
    """
    proc, url = serve_until_listening(setup.env, started, "--workers", "2", timeout_s=90)
    post_signed(url, range(4))
    for _ in range(8):  # fresh connections: both workers answer some of them
        with httpx.Client(timeout=30) as http:
            scrape = http.get(f"{url}/metrics")
            assert scrape.status_code == 404, scrape.text
            assert "PIPELINE_INGRESS__METRICS_PORT" in scrape.text
            assert http.get(f"{url}/healthz").status_code == 200
            assert http.get(f"{url}/readyz").status_code == 200
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=90)
    assert proc.returncode == 0, stderr
    assert "without PIPELINE_INGRESS__METRICS_PORT: /metrics is not served" in stderr


def test_each_worker_counts_its_own_on_its_metrics_port(
    setup: Setup, started: list[subprocess.Popen[str]]
) -> None:
    """Worker i serves /metrics on P + i; the workers' counters add up to every request."""
    first = free_ports(2)
    env = setup.env | {
        "PIPELINE_INGRESS__METRICS_PORT": str(first),
        "PIPELINE_INGRESS__METRICS_INTERVAL_S": "0.1",
    }
    proc, url = serve_until_listening(env, started, "--workers", "2", timeout_s=90)
    post_signed(url, range(30))
    deadline = time.monotonic() + 60
    while True:  # until both snapshots were refreshed after the last answer
        counts = []
        for port in (first, first + 1):
            with httpx.Client(timeout=30) as http:
                counts.append(accepted_count(http.get(f"http://127.0.0.1:{port}/metrics").text))
        if sum(counts) == 30 or time.monotonic() > deadline:
            break
    assert sum(counts) == 30, counts
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=90)
    assert proc.returncode == 0, stderr
    assert "/metrics is not served" not in stderr


def held_worker(ready: Connection) -> None:
    """A worker whose drain never ends by itself: SIGTERM is noted, a SIGINT ends it."""
    got: list[int] = []

    def on_term(signum: int, _frame: object) -> None:
        got.append(signum)
        ready.send("term")

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # a worker's uvicorn: a second SIGINT forces
    ready.send("listening")
    while True:
        signal.pause()


def test_a_second_signal_to_the_supervisor_reaches_the_workers() -> None:
    """A second Ctrl-C while the workers drain is passed on to each, as a single ingress gets it.

    The supervisor kept it to itself: however often the operator pressed Ctrl-C, the workers
    (whose uvicorn said "Waiting for connections to close. (CTRL+C to force quit)") were waited
    for until their stop bound plus 5 s.
    """
    context = multiprocessing.get_context("spawn")
    args = WorkerArgs("127.0.0.1", 0, None, None, "INFO")
    supervisor = Supervisor(2, args, lambda _host, _port: None)
    supervisor._stop_grace_s = 3600.0
    readers = []
    for index in range(2):
        reader, writer = context.Pipe(duplex=False)
        process = context.Process(target=held_worker, args=(writer,), daemon=True)
        process.start()
        writer.close()
        assert reader.recv() == "listening"
        supervisor._workers[index] = _Worker(index, process, reader, listening=True)
        readers.append(reader)
    processes = [worker.process for worker in supervisor._workers.values()]
    wake_r, wake_w = socket.socketpair()
    stopping = [signal.SIGINT]  # the first Ctrl-C, which ended the supervisor's watch
    stopper = threading.Thread(target=supervisor._stop_all, args=(wake_r, stopping))
    try:
        stopper.start()
        for reader in readers:  # each worker got its SIGTERM and drains
            assert reader.recv() == "term"
        stopping.append(signal.SIGINT)  # the second Ctrl-C, as the signal handler records it
        wake_w.send(b"\0")  # and the wakeup fd tells
        stopper.join(timeout=120)
        assert not stopper.is_alive(), "the second SIGINT did not reach the workers"
        assert [p.exitcode for p in processes] == [-signal.SIGINT, -signal.SIGINT]
    finally:
        for process in processes:
            if process.is_alive():
                process.kill()
                process.join()
        wake_r.close()
        wake_w.close()
