"""The orchestrator of ``make demo``: start everything, watch, drain, summarise, stop.

Order: declare the topics; start the schema registry and the ingress (each prints the URL it
listens on); start the consumer groups and the sweeper; send one warm-up webhook per lane and
wait until each lane has handled it (so start-up time does not count as wait); run the traffic
generator; watch until the traffic ends and the pipeline has drained (every accepted webhook
handled, dead-lettered or waiting in a retry tier) or the drain time runs out; stop every child
process group; write ``summary.json`` and the plots. SIGINT or SIGTERM skips to the stop.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from redis.asyncio import Redis
from redis.exceptions import RedisError
from rich.console import Console
from rich.live import Live

from demo import keys
from demo import offload as large
from demo.audit import Audit, GroupTopics, audit
from demo.dashboard import progress_line, render
from demo.held import held_rows
from demo.observe import RedisObservations
from demo.plots import write_plots
from demo.procs import ManagedProcess, ProcessFailed, run_once
from demo.stats import Collector
from demo.summary import Snapshot, summary_table, write_summary
from demo.traffic import sign_hub
from demo.watch import Watcher
from pipeline.config import IngressSettings, Settings, load_settings
from pipeline.errors import PipelineError
from pipeline.logstore import LogStore
from pipeline.logstore.create import create_log_store
from pipeline.offload.errors import OffloadError
from pipeline.topics.spec import load_specs
from pipeline.transport import create_transport
from pipeline.transport.protocol import Transport

SOURCES_FILE = Path(__file__).with_name("sources.yaml")
_SECRET_ENV = "DEMO_WEBHOOK_SECRET"  # noqa: S105 - the variable's name, not a secret
_LANES = {"messages": "message", "ai_turns": "ai", "engagement": "comment"}
_CONCURRENCY = {"messages": 32, "ai_turns": 32, "engagement": 4}
"""Handlers at once per group; engagement is kept small so the flood makes a queue."""
_TENANT_LIMIT = 2
"""Concurrent handlers one tenant may hold on a throttled lane (its ``throttle:`` keys)."""
_STOP_GRACE_S = 15.0


@dataclass(frozen=True)
class DemoOptions:
    """How to run the demo.

    Attributes:
        transport: ``redis`` (Redis Streams, the default) or ``kafka``.
        duration_s: how long the traffic runs.
        output: where the summary, plots, logs and the SQLite databases go.
        root: the project directory (topics/, consumers/).
        headless: no live dashboard, a progress line every few seconds instead.
        prefix: Redis key prefix of this run (None: a fresh one); its keys go at the end.
        keep_keys: keep this run's Redis keys at the end.
        drain_timeout_s: longest wait for the pipeline to drain after the traffic.
        ready_timeout_s: longest wait for a process or lane to become ready.
    """

    transport: str = "redis"
    duration_s: float = 180.0
    output: Path = Path("demo-output")
    root: Path = field(default_factory=Path.cwd)
    headless: bool = False
    prefix: str | None = None
    keep_keys: bool = False
    drain_timeout_s: float = 60.0
    ready_timeout_s: float = 90.0


class Demo:
    """One run of the demo."""

    def __init__(self, options: DemoOptions) -> None:
        """Prepare the run directory and the children's environment."""
        self.options = options
        self.run_id = secrets.token_hex(4)
        self.prefix = options.prefix or f"demo{self.run_id}"
        self.output = options.output.resolve()
        self.logs = self.output / "logs"
        self.console = Console()
        self.interrupted = asyncio.Event()
        self.processes: list[ManagedProcess] = []
        self.traffic: dict[str, Any] = {}
        self.accepted_series: list[tuple[float, int]] = []
        self.phase = "starting"
        self.started_at = 0.0
        self.s3 = large.s3_environment()
        self.offload_store = (
            f"s3://{large.BUCKET}/demo-{self.run_id}" if large.s3proxy_running(self.s3) else None
        )
        """Where the messages lane's large bodies go (None: S3Proxy is not running)."""
        if self.offload_store is not None:  # this process counts and deletes the objects
            for name, value in self.s3.items():
                os.environ.setdefault(name, value)
        self.offloaded: int | None = None
        self.env = self._environment()
        self.settings = self._settings()

    def _environment(self) -> dict[str, str]:
        groups = {lane: f"demo-{lane}" for lane in _LANES}
        topics = self.options.root / "topics"
        if self.offload_store is not None:  # a copy whose messages lane declares offload:
            topics = self.output / "topics"
        return {
            **os.environ,
            **(self.s3 if self.offload_store is not None else {}),
            "PIPELINE_TRANSPORT": self.options.transport,
            "PIPELINE_TOPICS_DIR": str(topics),
            "PIPELINE_REDIS__KEY_PREFIX": self.prefix,
            "PIPELINE_INGRESS__SOURCES_FILE": str(SOURCES_FILE),
            "PIPELINE_INGRESS__SQLITE_PATH": str(self.output / "ingress.db"),
            "PIPELINE_INGRESS__SWEEPER__ENABLED": "false",  # it runs as its own process
            "PIPELINE_INGRESS__SWEEPER__INTERVAL_S": "5",
            "PIPELINE_INGRESS__SWEEPER__LANE_GROUPS": json.dumps(groups),
            "PIPELINE_RUNTIME__MARK_PROCESSED": "true",
            # `pipeline consume` logs at INFO by default (a line per acknowledged example
            # message): the demo's processes keep to warnings unless the environment says.
            "PIPELINE_LOG_LEVEL": os.environ.get("PIPELINE_LOG_LEVEL", "WARNING"),
            # A tenant's slots on a throttled lane (engagement: 4 handlers per member), so the
            # flooder cannot take them all (unless the environment sets its own limit).
            "PIPELINE_THROTTLE__DEFAULT_LIMIT": os.environ.get(
                "PIPELINE_THROTTLE__DEFAULT_LIMIT", str(_TENANT_LIMIT)
            ),
            "PIPELINE_REGISTRY__STORE": f"sqlite:///{self.output / 'registry.db'}",
            _SECRET_ENV: os.environ.get(_SECRET_ENV) or secrets.token_urlsafe(24),
        }

    def _settings(self) -> Settings:
        redis = {"url": load_settings().redis.url, "key_prefix": self.prefix}
        return load_settings(transport=self.options.transport, redis=redis)

    def _bin(self, name: str) -> str:
        return str(Path(sys.executable).with_name(name))

    def _process(self, name: str, *argv: str, pipe: bool = False) -> ManagedProcess:
        process = ManagedProcess(
            name, argv, env=self.env, log_dir=self.logs, cwd=self.options.root, pipe_stdout=pipe
        )
        self.processes.append(process)
        return process

    # -- the run ------------------------------------------------------------------------------

    async def run(self) -> dict[str, Any]:
        """Run the demo to its end (or an interruption) and return the summary."""
        self._prepare_output()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self.interrupted.set)
        redis = Redis.from_url(self.settings.redis.url)
        transport = create_transport(self.settings)
        ingress = IngressSettings(sqlite_path=self.output / "ingress.db")
        store = create_log_store(self.settings, ingress)
        collector = Collector(start_ms=int(time.time() * 1000))
        specs = {spec.lane: spec for spec in load_specs(self.options.root / "topics")}
        self.groups = {
            f"demo-{lane}": GroupTopics(specs[lane].name, tuple(specs[lane].retry_topic_names()))
            for lane in _LANES
        }
        self.quiet_s = max(
            (spec.debounce.quiet_s for spec in specs.values() if spec.debounce), default=0.0
        )
        watcher = Watcher(redis, self.prefix, transport.admin(), store, collector, self.groups)
        opened = False
        try:
            try:
                url = await self._start()
                await store.open()
                opened = True
                await watcher.baseline()
                if not self.interrupted.is_set():
                    await self._warm_up(url, redis)
                collector.start_ms = int(time.time() * 1000)
                if not self.interrupted.is_set():
                    await self._traffic(url, watcher)
            finally:
                self.phase = "stopping"
                for process in reversed(self.processes):
                    await process.stop(_STOP_GRACE_S)
                for sig in (signal.SIGINT, signal.SIGTERM):
                    loop.remove_signal_handler(sig)
                if self.interrupted.is_set():
                    self._say_interrupted()
            with contextlib.suppress(PipelineError, RedisError):
                await watcher.observe()
                await watcher.poll_counts()
            found = None
            if opened and not self.interrupted.is_set():
                found = await self._audit(redis, transport, store, collector)
            return await self._finish(watcher, found)
        finally:
            if opened:
                await store.close()
            await self._clean_up(redis)
            await redis.aclose()
            await transport.close()

    async def _audit(
        self, redis: Redis, transport: Transport, store: LogStore, collector: Collector
    ) -> Audit | None:
        """Where the run's unfinished events are, with every process stopped (None: failed).

        The held followers of parked keys are read first: their only copy is in Redis.
        """
        self.console.print("auditing unfinished events in the topics ...", soft_wrap=True)
        try:
            held = await held_rows(redis, self.prefix, _LANES)
            return await audit(
                transport,
                store,
                collector.start_ms,
                self.groups,
                collector.finished_events,
                held=held,
            )
        except (PipelineError, RedisError) as exc:
            self._say(f"[yellow]audit failed:[/yellow] {exc}")
            return None

    def _say_interrupted(self) -> None:
        """Say, after Ctrl-C or SIGTERM, which processes were stopped and what comes next."""
        stopped = ", ".join(p.name for p in self.processes if p.proc is not None)
        keys = "kept (--keep-keys)" if self.options.keep_keys else "deleted"
        self.console.print(
            f"interrupted: stopped {stopped or 'nothing (none had started)'}; no audit; the"
            f" run's Redis keys are {keys}, its offloaded objects deleted",
            highlight=False,
            soft_wrap=True,
        )

    async def _finish(self, watcher: Watcher, found: Audit | None) -> dict[str, Any]:
        """Write the summary and the plots, print the summary table; return the summary."""
        self.phase = "done"
        self.offloaded = await self._offloaded()
        snapshot = self._snapshot(watcher)
        snapshot.audit = found
        data = write_summary(snapshot, self.output / "summary.json")
        plots = write_plots(snapshot, self.output)
        self.console.print(summary_table(data))
        where = ", ".join(str(p) for p in [self.output / "summary.json", *plots])
        note = "" if plots else " (no plots: pip install -e '.[demo]' for matplotlib)"
        self._say(f"written: {where}{note}; logs in {self.logs}")
        return data

    async def _offloaded(self) -> int | None:
        """The objects the run's large bodies became (None without S3Proxy, or unreadable)."""
        if self.offload_store is None:
            return None
        try:
            objects, size = await large.stored(self.offload_store)
        except OffloadError as exc:
            self._say(f"[yellow]offload count failed:[/yellow] {exc}")
            return None
        self.console.print(
            f"offload: {objects} objects, {size / 2**20:.1f} MiB in {self.offload_store}",
            highlight=False,
            soft_wrap=True,
        )
        return objects

    async def _clean_up(self, redis: Redis) -> None:
        """Delete the run's Redis keys (unless kept) and its objects in S3Proxy (if any)."""
        with contextlib.suppress(RedisError):
            if not self.options.keep_keys:
                await _delete_keys(redis, self.prefix)
        if self.offload_store is not None:
            with contextlib.suppress(OffloadError):
                await large.empty(self.offload_store)

    def _prepare_output(self) -> None:
        self.logs.mkdir(parents=True, exist_ok=True)
        if self.offload_store is not None:
            large.offloading_topics(
                self.options.root / "topics", self.output / "topics", self.offload_store
            )
        for stale in ("ingress.db", "ingress.db-wal", "ingress.db-shm", "registry.db"):
            (self.output / stale).unlink(missing_ok=True)
        for log in self.logs.glob("*.log"):
            log.unlink()

    async def _start(self) -> str:
        pipeline = self._bin("pipeline")
        self.console.print(
            f"[bold]demo[/bold] on {self.options.transport}, prefix {self.prefix}", soft_wrap=True
        )
        if self.offload_store is not None:
            where = f"{self.offload_store} (S3Proxy)"
            self.console.print(
                f"offload: large bodies of the messages lane go to {where}", soft_wrap=True
            )
        else:
            endpoint = self.s3["AWS_ENDPOINT_URL"]
            self.console.print(
                f"offload: off, S3Proxy is not running at {endpoint} (make services starts it): "
                "large bodies travel inline",
                highlight=False,
                soft_wrap=True,
            )
        await run_once([pipeline, "topics", "apply"], env=self.env, cwd=self.options.root)
        registry = self._process(
            "registry", pipeline, "registry", "serve", "--port", "0", pipe=True
        )
        ingress = self._process(
            "ingress", pipeline, "ingress", "serve", "--port", "0", "--sources", str(SOURCES_FILE),
            pipe=True,
        )  # fmt: skip
        await registry.start()
        await ingress.start()
        registry_url = await registry.wait_url(self.options.ready_timeout_s)
        url = await ingress.wait_url(self.options.ready_timeout_s)
        for process in (registry, ingress):
            _background(process.drain_stdout())
        for lane in _LANES:
            await self._process(
                f"consume-{lane}",
                pipeline, "consume", f"demo.groups:{lane}", "--group", f"demo-{lane}",
                "--concurrency", str(_CONCURRENCY[lane]),
            ).start()  # fmt: skip
        await self._process("sweeper", pipeline, "sweep", "--loop").start()
        self._say(f"ingress {url}, registry {registry_url}")
        return url

    async def _warm_up(self, url: str, redis: Redis) -> None:
        """Send one webhook per lane and wait until every lane has handled one.

        The warm-up events are received before the run's start time, so the collector and the
        log-row counts leave them out.
        """
        self.phase = "warming up"
        secret = self.env[_SECRET_ENV]
        async with httpx.AsyncClient(base_url=url, timeout=30.0) as client:
            for lane, kind in _LANES.items():
                body = json.dumps(
                    {
                        "id": f"{self.run_id}-warmup-{lane}",
                        "tenant": "warmup",
                        "conversation_id": f"warmup-{lane}",
                        "kind": kind,
                        "text": "warm-up",
                    }
                ).encode()
                headers = {"x-hub-signature-256": sign_hub(secret, body)}
                response = await client.post("/hooks/demo", content=body, headers=headers)
                response.raise_for_status()
        deadline = time.monotonic() + self.options.ready_timeout_s
        seen: set[str] = set()
        observations = RedisObservations(redis, self.prefix)
        last = "0"
        while seen != set(_LANES):
            if self.interrupted.is_set():
                return
            if time.monotonic() > deadline:
                missing = ", ".join(sorted(set(_LANES) - seen))
                raise ProcessFailed(f"lanes not handling after warm-up: {missing}; see {self.logs}")
            self._check_alive()
            last, batch = await observations.read(last)
            seen.update(o.lane for o in batch)
            await asyncio.sleep(0.2)

    async def _traffic(self, url: str, watcher: Watcher) -> None:
        generator = self._process(
            "traffic",
            sys.executable, "-m", "demo.traffic", "--url", url,
            "--duration-s", str(self.options.duration_s), "--run-id", self.run_id,
            pipe=True,
        )  # fmt: skip
        self.phase = "traffic"
        self.started_at = time.monotonic()
        await generator.start()
        reader = asyncio.create_task(self._read_traffic(generator))
        drain_deadline: float | None = None
        drained_at = 0.0
        counting: asyncio.Task[None] | None = None
        live = None if self._headless() else Live(console=self.console, refresh_per_second=4)
        last_line = 0.0
        with live or contextlib.nullcontext():
            while not self.interrupted.is_set():
                await asyncio.sleep(0.5)
                await watcher.observe()
                if counting is None or counting.done():  # slow on Kafka: never wait for it
                    counting = asyncio.create_task(watcher.poll_counts())
                snapshot = self._snapshot(watcher)
                if live is not None:
                    live.update(render(snapshot))
                elif time.monotonic() - last_line >= 5:  # noqa: PLR2004 - a line every 5 s
                    last_line = time.monotonic()
                    self._progress(snapshot)
                if reader.done() and drain_deadline is None:
                    self.phase = "draining"
                    drained_at = time.monotonic() + self.quiet_s + 1  # the last turns fire
                    drain_deadline = time.monotonic() + self.options.drain_timeout_s
                if drain_deadline is not None and (
                    (self._drained(snapshot) and time.monotonic() > drained_at)
                    or time.monotonic() > drain_deadline
                ):
                    break
                self._check_alive(but=generator)
        if counting is not None:
            await counting
        if self.interrupted.is_set():
            await generator.stop(_STOP_GRACE_S)
        with contextlib.suppress(asyncio.CancelledError, ProcessFailed):
            await asyncio.wait_for(reader, _STOP_GRACE_S)

    async def _read_traffic(self, generator: ManagedProcess) -> None:
        """Follow the generator's JSON lines until it exits."""
        while line := await generator.readline():
            with contextlib.suppress(ValueError):
                self.traffic = json.loads(line)
                elapsed = time.monotonic() - self.started_at
                self.accepted_series.append((elapsed, int(self.traffic.get("accepted", 0))))
        if generator.proc is not None:
            await generator.proc.wait()

    def _drained(self, snapshot: Snapshot) -> bool:
        """Nothing left in the main topics, and every unfinished event is in a retry tier."""
        return (
            self.traffic.get("done") is True
            and snapshot.main_backlog == 0
            and snapshot.unfinished <= snapshot.waiting_retry
        )

    def _check_alive(self, but: ManagedProcess | None = None) -> None:
        for process in self.processes:
            if process is not but and process.returncode is not None:
                raise ProcessFailed(
                    f"{process.name} exited with {process.returncode}; see {process.log_path}"
                )

    def _headless(self) -> bool:
        return self.options.headless or not sys.stdout.isatty()

    def _progress(self, s: Snapshot) -> None:
        self._say(progress_line(s))

    def _say(self, line: str) -> None:
        """Print one line whole: a pipe or a CI log gets no fold at the console's 80 columns."""
        self.console.print(line, highlight=False, soft_wrap=True)

    def _snapshot(self, watcher: Watcher) -> Snapshot:
        return Snapshot(
            transport=self.options.transport,
            elapsed_s=time.monotonic() - self.started_at if self.started_at else 0.0,
            duration_s=self.options.duration_s,
            phase=self.phase,
            traffic=self.traffic,
            rows=watcher.rows,
            dead_lettered=watcher.dead_lettered,
            retried=watcher.retried,
            in_retry=watcher.in_retry,
            main_backlog=watcher.main_backlog,
            collector=watcher.collector,
            interrupted=self.interrupted.is_set(),
            accepted_series=self.accepted_series,
            offloaded=self.offloaded,
            offload_store=self.offload_store,
        )


_BACKGROUND: set[asyncio.Task[None]] = set()


def _background(coro: Any) -> None:
    task: asyncio.Task[None] = asyncio.ensure_future(coro)
    _BACKGROUND.add(task)
    task.add_done_callback(_BACKGROUND.discard)


async def _delete_keys(redis: Redis, prefix: str) -> None:
    """Delete every key of this run (``SCAN MATCH`` + ``UNLINK``)."""
    for pattern in keys.run_patterns(prefix):
        batch: list[Any] = []
        async for key in redis.scan_iter(match=pattern, count=1_000):
            batch.append(key)
            if len(batch) >= 500:  # noqa: PLR2004 - one UNLINK per 500 keys
                await redis.unlink(*batch)
                batch = []
        if batch:
            await redis.unlink(*batch)
