"""Pipeline side by side with the task queues and stream processors users would otherwise pick.

Run: ``make bench-peers`` (= ``.venv/bin/python bench/peers_bench.py``; ``--quick`` for a short
run). Method and results: ``docs/benchmarks.md`` (Peers). On the shared local brokers:

* **Redis**: ours on Redis Streams against streaq, arq, saq, taskiq (taskiq-redis) and Celery;
* **Kafka**: ours on Kafka against FastStream (aiokafka), faust-streaming and quixstreams.

**Ours** is what users deploy: ``pipeline consume`` of a lane with retry tiers ``1s, 5s``, as its
own process, with Redis (parking, poison counting) and the metrics endpoint on, started in a
directory holding the lane's yaml and ``bench/lane_app.py`` (``bench/lane_process.py``). The
bare member without Redis or retry tiers stays as the extra row ``ours_bare``.

Every runner gets the same workload on a fresh uuid-named queue or topic. First ``--tasks``
(default 20,000) tasks of about 1 KiB are enqueued with the runner's own client (ours and every
Kafka runner: our producer, keys ``k0..k999``), untimed. Then its worker starts, as its own
process or processes, and drains that backlog: **tasks/s** is the backlog over the span from the
first handler start to the last, and **CPU-s per 10k** is the CPU time of the whole worker
process tree (psutil) over that span. Then, with the worker idle, ``--latency-tasks`` tasks are
enqueued at a steady ``--rate`` per second: **p50/p99** is enqueue to handler start over those.
Every handler does the same one thing: it appends one 24-byte record to a file (see
``bench/peers/_tasks.py``); ours does too, in a worker process of its own, so the handler costs
the same everywhere. The peers come from PyPI into their own virtualenvs (``bench/peers/.venv``
and ``bench/peers/.venv-redis5``), never the project's. A peer that cannot be installed or run is
reported as null with the reason.

Then the **end-to-end** latency: ``pipeline ingress serve`` (a subprocess; durable SQLite log)
takes signed webhooks at a steady 1,000/s (``bench/ingress.py``'s requests and open-loop load) and
``pipeline consume`` of a lane with retry tiers handles them (and, as ``<broker>_bare``, a bare
member in this process); webhook-to-handler time runs from each request's intended send time to
its handler start, on Kafka and on Redis.

The last line is one JSON object: ``{"bench": "peers", "vs_streaq": ..., ..., "e2e_p99_ms_kafka":
..., "e2e_p99_ms_redis": ...}`` with vs_X = our tasks/s / X's on the same broker and
ours_vs_bare_<broker> = ours / the bare member.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil
from redis.asyncio import Redis

sys.path.insert(0, str(Path(__file__).resolve().parent / "peers"))
from _tasks import RECORD, paced, payload, record, unpack
from common import BenchError, build_venv, package_versions
from ingress import (
    collector_off,
    commit_buckets,
    commit_figures,
    free_port,
    load,
    requests,
    start_ingress,
    stop,
    write_config,
)
from lane_process import consume_cmd, copy_app, write_lane
from runtime import PEERS_DIR, Harness, ensure_peer_env

from pipeline.config import RuntimeSettings, load_settings
from pipeline.envelope import Record
from pipeline.runtime import App, Context
from pipeline.runtime.member import Member
from pipeline.topics.admin import apply
from pipeline.topics.spec import TopicSpec
from pipeline.transport import create_transport

if TYPE_CHECKING:
    from collections.abc import Sequence

    from pipeline.transport.protocol import Producer, Transport

MAIN_PY = PEERS_DIR / ".venv" / "bin" / "python"
REDIS5_VENV = PEERS_DIR / ".venv-redis5"
REDIS5_PY = REDIS5_VENV / "bin" / "python"
KEYS = 1000
PARTITIONS = {"redis": 4, "kafka": 12}
WINDOW = 2000
RUN_TIMEOUT_S = 180.0
CONCURRENCY = 32  # streaq's own benchmark workload: 20,000 no-op tasks, concurrency 32, 1 worker
OURS_SETTINGS = RuntimeSettings(max_concurrency=CONCURRENCY)
OURS_TIERS = ["1s", "5s"]  # ours is a lane with retry tiers, as users deploy it
E2E = struct.Struct("<qqd")  # bench/lane_app.py's e2e record: sequence, timed, handler start
WARM = 20  # tasks a fresh worker must handle before the paced tasks start
STOP_GRACE_S = 10.0


@dataclass(frozen=True, slots=True)
class Peer:
    """One runner: its broker, interpreter and worker command."""

    name: str
    broker: str
    script: str = ""
    python: Path = MAIN_PY
    worker: tuple[str, ...] = ()

    @property
    def ours(self) -> bool:
        """Whether this runner is pipeline's (``ours`` or ``ours_bare``)."""
        return self.name in {"ours", "ours_bare"}

    def worker_cmd(self, topic: str, group: str) -> list[str]:
        """The worker's command line."""
        if self.name == "ours":
            return consume_cmd(group, "--concurrency", str(CONCURRENCY))
        if self.name == "ours_bare":
            here = str(Path(__file__).resolve())
            return [sys.executable, here, "--ours-worker", self.broker, topic, group]
        return [str(self.python), *(self.worker or (str(PEERS_DIR / self.script), "worker"))]


OURS = {b: Peer("ours", b) for b in ("redis", "kafka")}
OURS_BARE = {b: Peer("ours_bare", b) for b in ("redis", "kafka")}
PEERS = (
    Peer("streaq", "redis", "redis_streaq.py"),
    Peer("arq", "redis", "redis_arq.py", REDIS5_PY),
    Peer("saq", "redis", "redis_saq.py", REDIS5_PY),
    Peer(
        "taskiq",
        "redis",
        "redis_taskiq.py",
        worker=(
            "-m",
            "taskiq",
            "worker",
            "redis_taskiq:broker",
            "--workers",
            "1",
            "--max-async-tasks",
            str(CONCURRENCY),
            "--max-prefetch",
            str(CONCURRENCY),
        ),
    ),
    Peer("celery", "redis", "redis_celery.py"),
    Peer("faststream_kafka", "kafka", "faststream_peer.py"),
    Peer("faust", "kafka", "faust_peer.py"),
    Peer("quixstreams", "kafka", "kafka_quixstreams.py"),
)
VERSIONS = {
    MAIN_PY: [
        "streaq",
        "taskiq",
        "taskiq-redis",
        "celery",
        "faststream",
        "faust-streaming",
        "quixstreams",
        "aiokafka",
        "redis",
    ],
    REDIS5_PY: ["arq", "saq", "redis"],
}


@dataclass(slots=True)
class Result:
    """One runner's figures (None where it failed, with ``error``)."""

    name: str
    broker: str
    tasks_s: float | None = None
    p50_ms: float | None = None
    p99_ms: float | None = None
    cpu_s_per_10k: float | None = None
    processes: int = 0
    duplicates: int = 0
    error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


# -- records ------------------------------------------------------------------------------------


def read_records(path: Path) -> list[tuple[int, float, float]]:
    """Every (sequence, enqueued, started) record of a run."""
    data = path.read_bytes() if path.exists() else b""
    return [
        RECORD.unpack_from(data, i)
        for i in range(0, len(data) - len(data) % RECORD.size, RECORD.size)
    ]


def count(path: Path) -> int:
    """Records written so far."""
    try:
        return path.stat().st_size // RECORD.size
    except FileNotFoundError:
        return 0


def tree_cpu_s(proc: psutil.Process) -> tuple[float, int]:
    """CPU seconds of a process and its descendants, and how many processes that was."""
    total, procs = 0.0, 0
    for p in [proc, *proc.children(recursive=True)]:
        with contextlib.suppress(psutil.NoSuchProcess):
            t = p.cpu_times()
            total += t.user + t.system + t.children_user + t.children_system
            procs += 1
    return total, procs


async def wait_count(
    path: Path,
    target: int,
    worker: subprocess.Popen[bytes],
    label: str,
    timeout_s: float,
    *,
    partial: bool = False,
) -> None:
    """Wait until ``target`` records exist (or, if ``partial``, until ``timeout_s`` is up).

    Raises BenchError if the worker dies, or if time runs out and ``partial`` is False.
    """
    deadline = time.monotonic() + timeout_s
    while count(path) < target:
        if worker.poll() is not None:
            done = count(path)
            raise BenchError(f"{label}: worker exited {worker.returncode} at {done}/{target}")
        if time.monotonic() > deadline:
            if partial:
                return
            raise BenchError(f"{label}: {count(path)} of {target} handled in {timeout_s:.0f} s")
        await asyncio.sleep(0.005)


def stop_worker(worker: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the worker's process group, SIGKILL after a grace period."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(worker.pid, signal.SIGTERM)
    try:
        worker.wait(STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(worker.pid, signal.SIGKILL)
        worker.wait()


def _pct(values: Sequence[float], q: int) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


# -- the runs -----------------------------------------------------------------------------------


class Bench:
    """The brokers' clients and a scratch directory for every run."""

    def __init__(self, workdir: Path) -> None:
        """Use the usual settings' brokers."""
        self.settings = load_settings()
        self.kafka = Harness(self.settings)  # Kafka admin helpers shared with bench/runtime.py
        self.transports: dict[str, Transport] = {
            "kafka": self.kafka.transport,
            "redis": create_transport(self.settings, "redis"),
        }
        self.redis = Redis.from_url(self.settings.redis.url)
        self.urls = {"kafka": self.kafka.bootstrap, "redis": self.settings.redis.url}
        self.workdir = workdir
        self._producers: dict[str, Producer] = {}

    def producer(self, broker: str) -> Producer:
        """The harness's one producer on ``broker``, made at its first use and kept.

        A paced run's first tasks would otherwise wait for a new client to start (on Kafka,
        for its idempotent producer id), which is the harness's delay, not the runner's.
        """
        producer = self._producers.get(broker)
        if producer is None:
            producer = self._producers[broker] = self.transports[broker].producer()
        return producer

    async def close(self) -> None:
        """Release every client."""
        for producer in self._producers.values():
            await producer.close()
        await self.kafka.close()
        await self.transports["redis"].close()
        await self.redis.aclose()

    async def create(self, peer: Peer, topic: str) -> TopicSpec:
        """The run's topic: a lane for ours, a plain topic for the Kafka peers.

        ``ours`` gets a lane with retry tiers named after the topic (so its parking keys hold
        the topic's name and the cleanup finds them), written with the app module into the
        directory ``pipeline consume`` runs in; ``ours_bare`` the plain lane of before.
        """
        doc: dict[str, Any] = {"name": topic, "partitions": PARTITIONS[peer.broker]}
        if peer.name == "ours":
            doc |= {"lane": topic, "retry": {"tiers": OURS_TIERS}}
            write_lane(self.workdir / topic, doc)
        else:
            doc["lane"] = "bench"
        spec = TopicSpec.model_validate(doc)
        if peer.broker == "kafka":
            if peer.ours:
                await self.kafka.declare(spec)
            else:
                await self.kafka.create_topic(topic, spec.partitions)
        elif peer.ours:
            await apply(self.transports["redis"].admin(), [spec], 100_000, dry_run=False)
        return spec

    def worker_env(
        self, peer: Peer, topic: str, env: dict[str, str]
    ) -> tuple[dict[str, str], Path]:
        """The worker's environment and working directory.

        ``pipeline consume`` gets the default settings but for the broker, the shared Redis
        (parking, poison counting) and a metrics endpoint on a free port.
        """
        if peer.name != "ours":
            return env, self.workdir
        env = {
            **env,
            "PIPELINE_TRANSPORT": peer.broker,
            "PIPELINE_KAFKA__BOOTSTRAP_SERVERS": self.kafka.bootstrap,
            "PIPELINE_REDIS__URL": self.settings.redis.url,
            "PIPELINE_RUNTIME__METRICS_PORT": str(free_port()),
            "BENCH_LANE": topic,
            "BENCH_MODE": "record",
        }
        return env, self.workdir / topic

    async def cleanup(self, peer: Peer, spec: TopicSpec, group: str) -> None:
        """Delete the run's topics, group and Redis keys."""
        if peer.broker == "kafka":
            await self.kafka.drop_group(group)
            extra = await asyncio.to_thread(self.kafka._topics_named, group)  # noqa: SLF001 - faust's own topics
            names = spec.topic_names() if peer.ours else [spec.name]
            await self.kafka.drop_topics(
                [n for n in names if n in await self._kafka_topics()] + extra
            )
        elif peer.ours:
            with contextlib.suppress(Exception):
                for name in spec.topic_names():
                    await self.transports["redis"].admin().delete_topic(name)
        keys = [k async for k in self.redis.scan_iter(match=f"*{spec.name}*", count=1000)]
        for i in range(0, len(keys), 500):
            await self.redis.delete(*keys[i : i + 500])

    async def _kafka_topics(self) -> set[str]:
        meta = await asyncio.to_thread(self.kafka.raw_admin.list_topics, None, 5.0)
        return set(meta.topics)

    async def enqueue(
        self, peer: Peer, topic: str, env: dict[str, str], n: int, rate: float, start: int
    ) -> None:
        """Enqueue tasks ``start..start+n-1``: our producer, or the peer's own client."""
        spec = argparse.Namespace(count=n, rate=rate, start=start)
        if peer.broker == "kafka" or peer.ours:
            producer = self.producer(peer.broker)

            def key(seq: int) -> bytes:
                return b"k%d" % (seq % KEYS)

            if rate > 0:
                await paced(spec, lambda s, now: producer.send(topic, payload(s, now), key=key(s)))
            else:
                for i in range(start, start + n, WINDOW):
                    window = range(i, min(start + n, i + WINDOW))
                    now = time.monotonic()
                    await producer.send_many(
                        topic, [Record(payload(s, now), key(s)) for s in window]
                    )
            return
        cmd = [
            str(peer.python),
            str(PEERS_DIR / peer.script),
            "enqueue",
            "--count",
            str(n),
            "--rate",
            str(rate),
            "--start",
            str(start),
        ]
        proc = await asyncio.create_subprocess_exec(
            *cmd, env=env, cwd=self.workdir, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        try:
            _, err = await asyncio.wait_for(proc.communicate(), RUN_TIMEOUT_S)
        except TimeoutError as exc:
            proc.kill()
            raise BenchError(
                f"{peer.name}: enqueue of {n} took over {RUN_TIMEOUT_S:.0f} s"
            ) from exc
        if proc.returncode != 0:
            tail = " | ".join(err.decode(errors="replace").strip().splitlines()[-3:])
            raise BenchError(f"{peer.name}: enqueue exited {proc.returncode}: {tail}")

    async def run(self, peer: Peer, n: int, m: int, rate: float, cap_s: float) -> Result:
        """A backlog of ``n`` drained (for at most ``cap_s``), then ``m`` at ``rate``/s."""
        result = Result(peer.name, peer.broker)
        try:
            await self._phase(peer, result, n, 0.0, cap_s)
            await self._phase(peer, result, m, rate, cap_s)
        except (BenchError, OSError, psutil.Error, subprocess.SubprocessError) as exc:
            result.error = str(exc)
        return result

    async def _phase(self, peer: Peer, result: Result, n: int, rate: float, cap_s: float) -> None:
        """One worker on a fresh queue: drain a backlog (rate 0) or take tasks at ``rate``/s."""
        topic = f"bench_peers_{peer.name}_{uuid.uuid4().hex[:12]}"
        group = f"{topic}_g"
        rec = self.workdir / f"{topic}.rec"
        log = self.workdir / f"{topic}.log"
        env = {
            **os.environ,
            "PEER_URL": self.urls[peer.broker],
            "PEER_QUEUE": topic,
            "PEER_RECORD": str(rec),
            "PEER_GROUP": group,
            # the task modules first; a caller's own path (another tree to measure) after them
            "PYTHONPATH": os.pathsep.join(
                filter(None, (str(PEERS_DIR), os.environ.get("PYTHONPATH")))
            ),
        }
        spec = TopicSpec.model_validate({"name": topic, "partitions": 1, "lane": "bench"})
        worker: subprocess.Popen[bytes] | None = None
        try:
            spec = await self.create(peer, topic)
            if rate <= 0:
                await self.enqueue(peer, topic, env, n, 0, 0)
            worker_env, cwd = self.worker_env(peer, topic, env)
            with log.open("wb") as err:
                worker = subprocess.Popen(  # noqa: ASYNC220 - returns at once
                    peer.worker_cmd(topic, group),
                    env=worker_env,
                    cwd=cwd,
                    stdout=subprocess.DEVNULL,
                    stderr=err,
                    start_new_session=True,
                )
            ps = psutil.Process(worker.pid)
            if rate <= 0:
                await wait_count(rec, 1, worker, peer.name, RUN_TIMEOUT_S)
                cpu0, _ = tree_cpu_s(ps)
                await wait_count(rec, n, worker, peer.name, cap_s, partial=True)
                cpu1, result.processes = tree_cpu_s(ps)
                starts = [started for _, _, started in read_records(rec)]
                result.extra["backlog_handled"] = len(starts)
                result.tasks_s = len(starts) / (max(starts) - min(starts))
                result.cpu_s_per_10k = (cpu1 - cpu0) * 10_000 / len(starts)
            else:
                await self.enqueue(peer, topic, env, WARM, 0, 0)  # ready once these are handled
                await wait_count(rec, WARM, worker, peer.name, RUN_TIMEOUT_S)
                await self.enqueue(peer, topic, env, n, rate, WARM)
                await wait_count(rec, WARM + n, worker, peer.name, RUN_TIMEOUT_S)
                records = read_records(rec)
                steady = [(st - enq) * 1000 for seq, enq, st in records if seq >= WARM]
                result.p50_ms, result.p99_ms = _pct(steady, 50), _pct(steady, 99)
                result.duplicates = len(records) - len({seq for seq, _, _ in records})
        except BenchError as exc:
            tail = log.read_text(errors="replace").strip().splitlines()[-3:] if log.exists() else []
            raise BenchError(
                f"{exc}" + (f" (worker stderr: {' | '.join(tail)})" if tail else "")
            ) from exc
        finally:
            if worker is not None:
                stop_worker(worker)
            await self.cleanup(peer, spec, group)


# -- end to end: webhook to handler through the real ingress ------------------------------------


class _BareE2E:
    """The bare member in this process (no Redis, no retry tiers): the ``_bare`` e2e runs."""

    def __init__(self, bench: Bench, broker: str, spec: TopicSpec, group: str, tag: str) -> None:
        """Handle ``spec``'s lane in ``group``; webhooks tagged ``tag`` are the timed run."""
        self.handled: dict[str, list[tuple[int, float]]] = {"warm": [], "run": []}
        loop = asyncio.get_running_loop()

        async def handle(_event: bytes, ctx: Context) -> None:
            started = loop.time()
            run, _, seq = (ctx.event_id or "").rpartition(".")
            self.handled["run" if run.endswith(f".{tag}") else "warm"].append((int(seq), started))

        app = App([spec])
        app.handler(spec.lane)(handle)
        self._member = Member(app, bench.transports[broker], group, RuntimeSettings())
        self._stop = asyncio.Event()
        self._task = asyncio.create_task(self._member.run(self._stop))

    def check(self) -> None:
        """Raise if the member stopped."""
        if self._task.done():
            self._task.result()
            raise BenchError("e2e: the member stopped")

    async def close(self) -> None:
        """Stop the member."""
        self._stop.set()
        await asyncio.wait_for(self._task, 60)


class _ConsumeE2E:
    """``pipeline consume`` of the lane (retry tiers, Redis, metrics on) in its own process."""

    def __init__(self, bench: Bench, broker: str, workdir: Path, group: str, tag: str) -> None:
        """Start the consumer in ``workdir`` (the lane's yaml and the app module)."""
        self._records = workdir / "e2e.rec"
        self._log = workdir / "consumer.log"
        spec = TopicSpec.model_validate(
            json.loads((workdir / "topics" / "bench.yaml").read_text(encoding="utf-8"))
        )
        env, _ = bench.worker_env(OURS[broker], spec.lane, {**os.environ})
        env |= {"BENCH_MODE": "e2e", "BENCH_TAG": tag, "BENCH_RECORDS": str(self._records)}
        with self._log.open("wb") as err:
            self._proc = subprocess.Popen(
                consume_cmd(group),
                env=env,
                cwd=workdir,
                stdout=subprocess.DEVNULL,
                stderr=err,
                start_new_session=True,
            )

    @property
    def handled(self) -> dict[str, list[tuple[int, float]]]:
        """(sequence, handler start) of the warm-up and of the timed webhooks so far."""
        data = self._records.read_bytes() if self._records.exists() else b""
        out: dict[str, list[tuple[int, float]]] = {"warm": [], "run": []}
        for i in range(0, len(data) - len(data) % E2E.size, E2E.size):
            seq, timed, started = E2E.unpack_from(data, i)
            out["run" if timed else "warm"].append((seq, started))
        return out

    def check(self) -> None:
        """Raise if the consumer exited."""
        if self._proc.poll() is not None:
            lines = self._log.read_text(errors="replace").strip().splitlines()[-3:]
            raise BenchError(
                f"e2e: pipeline consume exited {self._proc.returncode}: {' | '.join(lines)}"
            )

    async def close(self) -> None:
        """Stop the consumer."""
        await asyncio.to_thread(stop_worker, self._proc)


async def e2e(
    bench: Bench, broker: str, rate: int, seconds: float, *, bare: bool = False
) -> dict[str, Any]:
    """Signed webhooks at ``rate``/s into ``pipeline ingress serve``, handled by ``pipeline
    consume`` of a lane with retry tiers (its own process), or with ``bare`` by a bare member in
    this process."""
    tag = uuid.uuid4().hex[:10]
    topic = f"bench_peers_e2e_{tag}"
    workdir = bench.workdir / f"e2e-{tag}"
    spec_doc = write_config(workdir, topic)
    if not bare:  # lane named after the topic, so the cleanup finds its parking keys
        spec_doc |= {"lane": topic, "retry": {"tiers": OURS_TIERS}}
        (workdir / "topics" / "bench.yaml").write_text(json.dumps(spec_doc), encoding="utf-8")
        copy_app(workdir)
    spec = TopicSpec.model_validate(spec_doc)
    if broker == "kafka":
        await bench.kafka.declare(spec)
    else:
        await apply(bench.transports["redis"].admin(), [spec], 100_000, dry_run=False)
    loop = asyncio.get_running_loop()
    group = f"{topic}_g"
    consumer: _BareE2E | _ConsumeE2E = (
        _BareE2E(bench, broker, spec, group, tag)
        if bare
        else _ConsumeE2E(bench, broker, workdir, group, tag)
    )
    proc: subprocess.Popen[bytes] | None = None
    try:
        proc, port = start_ingress(workdir, "FULL", transport=broker)
        warm, _, _ = await load(port, requests(200, f"w{tag}"), None)
        await _until(lambda: len(consumer.handled["warm"]) >= warm, consumer, "warm-up")
        raw = requests(int(rate * seconds), tag)
        commits_before = await asyncio.to_thread(commit_buckets, port, time.time())
        # The sender's collector pauses are not the system's latency. A bare member runs in
        # this process, so it runs without the collector too while the load is sent.
        with collector_off():
            before = loop.time()  # the monotonic clock, which the consumer's process shares
            accepted, _, http = await load(port, raw, rate)
        start = before + 0.05  # load() schedules request i at its start + i / rate
        await _until(lambda: len(consumer.handled["run"]) >= accepted, consumer, "webhooks")
        handled = consumer.handled["run"]
        commits = commit_figures(
            commits_before, await asyncio.to_thread(commit_buckets, port, time.time())
        )
    finally:
        if proc is not None:
            stop(proc)
        await consumer.close()
        if broker == "kafka":
            await bench.kafka.drop_group(group)
            await bench.kafka.drop_topics(spec.topic_names())
        else:
            for name in spec.topic_names():
                await bench.transports["redis"].admin().delete_topic(name)
        keys = [k async for k in bench.redis.scan_iter(match=f"*{topic}*", count=1000)]
        if keys:
            await bench.redis.delete(*keys)
    latencies = [(t - (start + seq / rate)) * 1000 for seq, t in handled]
    return {
        "accepted": accepted,
        "sent": len(raw),
        "handled": len(handled),
        "p50_ms": round(_pct(latencies, 50), 1),
        "p99_ms": round(_pct(latencies, 99), 1),
        "http_p99_ms": round(_pct(http, 99) * 1000, 1),
        "slow_commits": int(commits["slow_commits"] or 0),
        "slowest_commit_le_ms": commits["slowest_commit_le_ms"],
    }


async def _until(predicate: Any, consumer: _BareE2E | _ConsumeE2E, what: str) -> None:
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while not predicate():
        consumer.check()
        if time.monotonic() > deadline:
            raise BenchError(f"e2e: the {what} were not all handled in {RUN_TIMEOUT_S:.0f} s")
        await asyncio.sleep(0.01)


# -- our worker process -------------------------------------------------------------------------


async def ours_worker(broker: str, topic: str, group: str) -> None:
    """A member on ``topic`` whose handler writes one record; stops on SIGTERM."""
    transport = create_transport(load_settings(), broker)
    spec = TopicSpec.model_validate(
        {"name": topic, "partitions": PARTITIONS[broker], "lane": "bench"}
    )
    app = App([spec])

    @app.handler("bench")
    async def handle(event: bytes, _ctx: Context) -> None:
        record(*unpack(event))

    stop_event = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop_event.set)
    try:
        await Member(app, transport, group, OURS_SETTINGS).run(stop_event)
    finally:
        await transport.close()


# -- environments, report, main -----------------------------------------------------------------


def ensure_redis5_env() -> None:
    """Build or update bench/peers/.venv-redis5 (arq, saq); BenchError with the reason."""
    build_venv(REDIS5_VENV, PEERS_DIR / "requirements-redis5.txt", "arq, saq")


def versions() -> dict[str, str]:
    """The peers' package versions, per venv."""
    out: dict[str, str] = {}
    for python, packages in VERSIONS.items():
        if not python.exists():  # a venv not built because its peers were skipped
            continue
        try:
            found = package_versions(python, packages)
        except BenchError:
            continue
        suffix = "" if python == MAIN_PY else " (redis5 venv)"
        out |= {f"{k}{suffix}": v for k, v in found.items()}
    return out


def prepare(skip: Sequence[str] = ()) -> dict[str, str]:
    """Build the peers' venvs that a runner not in ``skip`` needs; returns {runner: reason}
    for every runner that cannot run."""
    broken: dict[str, str] = {}
    needed = {p.python for p in PEERS if p.name not in skip}
    if MAIN_PY in needed:
        try:
            ensure_peer_env()
        except Exception as exc:
            broken |= {p.name: str(exc) for p in PEERS if p.python == MAIN_PY}
    if REDIS5_PY in needed:
        try:
            ensure_redis5_env()
        except (BenchError, OSError, subprocess.SubprocessError) as exc:
            broken |= {p.name: str(exc) for p in PEERS if p.python == REDIS5_PY}
    return broken


def table(results: list[Result], ours: dict[str, float | None]) -> None:
    """The human-readable table."""
    print(
        f"\n{'runner':<18}{'broker':<7}{'tasks/s':>9}{'ours/it':>9}{'p50 ms':>8}{'p99 ms':>8}"
        f"{'cpu/10k':>9}{'procs':>6}"
    )
    for r in results:
        if r.tasks_s is None or r.p50_ms is None or r.p99_ms is None:
            print(f"{r.name:<18}{r.broker:<7}{'null':>9}  {r.error}")
            continue
        base = ours[r.broker]
        ratio = f"{base / r.tasks_s:>9.2f}" if base else f"{'-':>9}"
        print(
            f"{r.name:<18}{r.broker:<7}{r.tasks_s:>9,.0f}{ratio}{r.p50_ms:>8.1f}"
            f"{r.p99_ms:>8.1f}{r.cpu_s_per_10k or 0:>9.2f}{r.processes:>6}"
            + (f"  duplicates {r.duplicates}" if r.duplicates else "")
        )


async def run_broker(
    bench: Bench, broker: str, args: argparse.Namespace, broken: dict[str, str]
) -> list[Result]:
    """Ours, every peer of ``broker``, the bare member, ours again."""
    peers = [p for p in PEERS if p.broker == broker]
    results = []
    for peer in [OURS[broker], *peers, OURS_BARE[broker], OURS[broker]]:
        if peer.name in args.skip:
            results.append(Result(peer.name, broker, error="skipped (--skip)"))
            continue
        if peer.name in broken:
            results.append(Result(peer.name, broker, error=broken[peer.name]))
            continue
        r = await bench.run(peer, args.tasks, args.latency_tasks, args.rate, args.drain_cap_s)
        results.append(r)
        note = f" error: {r.error}" if r.error else ""
        print(
            f"  {r.name}: {r.tasks_s or 0:,.0f}/s p99 {r.p99_ms or 0:.1f} ms{note}",
            file=sys.stderr,
            flush=True,
        )
    return results


async def run_e2e(bench: Bench, args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """The webhook-to-handler runs, Kafka then Redis; a failure is kept as its reason."""
    runs: dict[str, dict[str, Any]] = {}
    for broker in ("kafka", "redis"):
        for bare in (False, True):
            name = f"{broker}_bare" if bare else broker
            try:
                runs[name] = await e2e(bench, broker, args.e2e_rate, args.e2e_seconds, bare=bare)
            except (BenchError, OSError, SystemExit) as exc:
                runs[name] = {"error": str(exc)}
            print(f"  e2e {name}: {runs[name]}", file=sys.stderr, flush=True)
    return runs


async def run_all(args: argparse.Namespace) -> dict[str, Any]:
    """Every runner, Redis then Kafka (ours first and last on each), then the two e2e runs."""
    broken = await asyncio.to_thread(prepare, args.skip)
    results: list[Result] = []
    with tempfile.TemporaryDirectory(prefix="bench-peers-") as tmp:
        bench = Bench(Path(tmp))
        try:
            await bench.kafka.probe()
            for broker in ("redis", "kafka"):
                results += await run_broker(bench, broker, args, broken)
            e2e_runs = await run_e2e(bench, args)
        finally:
            await bench.close()
    ours_rate: dict[str, float | None] = {}
    for broker in ("redis", "kafka"):
        runs = [r.tasks_s for r in results if r.name == "ours" and r.broker == broker and r.tasks_s]
        ours_rate[broker] = statistics.mean(runs) if runs else None
    table(results, ours_rate)
    out: dict[str, Any] = {"bench": "peers"}
    for r in results:
        if r.name == "ours":
            continue
        base = ours_rate[r.broker]
        ratio = round(base / r.tasks_s, 2) if base and r.tasks_s else None
        # ours (pipeline consume) ÷ the bare member, per broker; < 1 is the guard's cost
        out[f"ours_vs_bare_{r.broker}" if r.name == "ours_bare" else f"vs_{r.name}"] = ratio
        if r.error:
            print(f"{r.name}: null, because: {r.error}")
    for broker in ("kafka", "redis"):
        out[f"e2e_p99_ms_{broker}"] = e2e_runs[broker].get("p99_ms")
        out[f"e2e_p99_ms_{broker}_bare"] = e2e_runs[f"{broker}_bare"].get("p99_ms")
    out["details"] = {
        "runners": [vars_of(r) for r in results],
        "ours_tasks_s": {b: round(v) if v else None for b, v in ours_rate.items()},
        "ours": f"pipeline consume, retry tiers {OURS_TIERS}, Redis, metrics on, concurrency "
        f"{CONCURRENCY}; ours_bare: a Member without Redis or retry tiers",
        "e2e": e2e_runs,
        "tasks": args.tasks,
        "drain_cap_s": args.drain_cap_s,
        "latency_tasks": args.latency_tasks,
        "rate": args.rate,
        "e2e_rate": args.e2e_rate,
        "e2e_seconds": args.e2e_seconds,
        "versions": versions(),
        "cpus": os.cpu_count(),
        "load_avg": os.getloadavg(),
        "date": time.strftime("%Y-%m-%d"),
    }
    return out


def vars_of(r: Result) -> dict[str, Any]:
    """A result as plain JSON values, rounded."""

    def rnd(v: float | None, d: int) -> float | None:
        return None if v is None else round(v, d)

    return {
        "name": r.name,
        "broker": r.broker,
        "tasks_s": rnd(r.tasks_s, 0),
        "p50_ms": rnd(r.p50_ms, 1),
        "p99_ms": rnd(r.p99_ms, 1),
        "cpu_s_per_10k": rnd(r.cpu_s_per_10k, 2),
        "processes": r.processes,
        "duplicates": r.duplicates,
        **r.extra,
        "error": r.error,
    }


def main() -> int:
    """Parse the arguments, run, print the table and the JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="5,000 tasks, short e2e runs")
    parser.add_argument("--tasks", type=int, default=20_000, help="backlog per runner")
    parser.add_argument("--drain-cap-s", type=float, default=30.0, help="longest backlog drain")
    parser.add_argument("--latency-tasks", type=int, default=500, help="paced tasks per runner")
    parser.add_argument("--rate", type=float, default=50.0, help="paced tasks per second")
    parser.add_argument("--e2e-rate", type=int, default=1_000, help="webhooks per second")
    parser.add_argument("--e2e-seconds", type=float, default=10.0)
    parser.add_argument(
        "--skip", nargs="*", default=[], choices=[p.name for p in PEERS] + ["ours_bare"]
    )
    parser.add_argument(
        "--ours-worker", nargs=3, metavar=("BROKER", "TOPIC", "GROUP"), help=argparse.SUPPRESS
    )
    args = parser.parse_args()
    if args.ours_worker:
        asyncio.run(ours_worker(*args.ours_worker))
        return 0
    if args.quick:
        args.tasks, args.drain_cap_s, args.latency_tasks, args.e2e_seconds = 5_000, 10.0, 200, 3.0
    try:
        out = asyncio.run(run_all(args))
    except BenchError as exc:
        print(f"bench/peers_bench.py: error: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(out.pop("details")))
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
