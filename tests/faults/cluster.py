"""One scenario's pipeline as real processes: ingress, consumer-group members and the sweeper.

Every process is ``python -m pipeline ...`` with the scenario's environment: a private Redis, the
private Kafka (Kafka scenarios), an SQLite log store in the scenario's directory, one lane with
short retry tiers, and fast group timings. A supervisor task restarts any member or sweeper that
exits, and the ingress when it exits on its own, as an orchestrator would; exits that no fault
caused are recorded as crashes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

import yaml
from faults.services import free_port, port_open
from support import delete_after_test, delete_group_after

from pipeline.config import Settings, load_settings
from pipeline.logstore.sqlite import SqliteLogStore
from pipeline.retry.keys import encode_key
from pipeline.topics.admin import apply
from pipeline.topics.spec import TopicSpec
from pipeline.transport import create_transport

TESTS = Path(__file__).resolve().parents[1]
SECRET = "faults-secret"  # noqa: S105 - a test secret
INGRESS = ("ingress", "ingress", "serve", "--port")
RETRY = {"tiers": ["300ms", "1s"], "max_attempts": 3, "after_dead_letter": "proceed"}


class Cluster:
    """The processes of one scenario, and how to kill and restart each of them."""

    def __init__(
        self,
        directory: Path,
        transport: str,
        unique: str,
        *,
        redis_url: str,
        bootstrap_servers: str | None,
        members: int = 2,
        partitions: int = 4,
        retry: dict[str, object] | None = None,
        app: str = "faults.app:app",
        env: dict[str, str] | None = None,
    ) -> None:
        """Lay out the scenario in ``directory``; nothing runs until :meth:`start`.

        ``retry`` replaces the lane's retry policy, ``app`` the members' consumer app and ``env``
        adds to (or overrides) the processes' environment.
        """
        self.directory = directory
        self.transport = transport
        self.lane = f"faults_{unique}"
        self.group = f"g-{unique}"
        self.prefix = f"fx-{unique}"
        self.redis_url = redis_url
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.retry = RETRY if retry is None else retry
        self.app = app
        self.spec = TopicSpec.model_validate(
            {"name": self.lane, "partitions": partitions, "retry": self.retry}
        )
        self.member_count = members
        self.members: list[asyncio.subprocess.Process | None] = [None] * members
        self.sweeper: asyncio.subprocess.Process | None = None
        self.ingress: asyncio.subprocess.Process | None = None
        self.restarts = 0
        self.crashes: list[str] = []
        self._killed: set[int] = set()
        self._ingress_restarting = False
        self._stopping = False
        self._supervisor: asyncio.Task[None] | None = None
        self._logs: list[IO[bytes]] = []
        self._log_names: dict[int, str] = {}
        """Each process's log file (in ``directory``), by process id."""
        self._member_starts = 0
        kafka = {"session_timeout_ms": 3000, "request_timeout_ms": 5000}
        if bootstrap_servers is not None:
            kafka["bootstrap_servers"] = bootstrap_servers  # type: ignore[assignment]
        self.settings: Settings = load_settings(
            transport=transport,
            kafka=kafka,
            redis={"url": redis_url, "heartbeat_ms": 100, "lease_ms": 1500},
        )
        self.env = {**self._environment(bootstrap_servers), **(env or {})}

    def _environment(self, bootstrap_servers: str | None) -> dict[str, str]:
        topics = self.directory / "topics"
        topics.mkdir(parents=True, exist_ok=True)
        (topics / f"{self.lane}.yaml").write_text(
            yaml.safe_dump(
                {"name": self.lane, "partitions": self.spec.partitions, "retry": self.retry}
            ),
            encoding="utf-8",
        )
        source = {
            "scheme": "meta",
            "secrets": ["env:FAULTS_SECRET"],
            "tenant": {"pointer": "/tenant"},
            "key": {"pointer": "/key"},
            "event_id": {"pointer": "/id"},
            "topic": self.lane,
        }
        sources = self.directory / "sources.yaml"
        sources.write_text(yaml.safe_dump({"sources": {"hooks": source}}), encoding="utf-8")
        env = {
            **os.environ,
            "FAULTS_SECRET": SECRET,
            "FAULTS_LANE": self.lane,
            "FAULTS_PREFIX": self.prefix,
            "PIPELINE_TRANSPORT": self.transport,
            "PIPELINE_TOPICS_DIR": str(topics),
            "PIPELINE_REDIS__URL": self.redis_url,
            "PIPELINE_REDIS__LEASE_MS": "1500",
            "PIPELINE_REDIS__HEARTBEAT_MS": "100",
            "PIPELINE_KAFKA__SESSION_TIMEOUT_MS": "3000",
            "PIPELINE_KAFKA__REQUEST_TIMEOUT_MS": "5000",
            "PIPELINE_MEMBERSHIP__SLOT_DIR": str(self.directory / "slots"),  # member name slots
            "PIPELINE_RUNTIME__MARK_PROCESSED": "true",
            "PIPELINE_RUNTIME__COMMIT_INTERVAL_MS": "100",
            "PIPELINE_RUNTIME__LIVENESS_MS": "1500",  # a crashed member's suspects wait this long
            "PIPELINE_RUNTIME__SHUTDOWN_GRACE_S": "2",
            "PIPELINE_INGRESS__SOURCES_FILE": str(sources),
            "PIPELINE_INGRESS__SQLITE_PATH": str(self.directory / "ingress.db"),
            # NORMAL survives kill -9 of any process (the faults here), not a power loss; FULL
            # (the default) costs an fsync per commit that this suite does not exercise.
            "PIPELINE_INGRESS__SQLITE_SYNCHRONOUS": "NORMAL",
            "PIPELINE_INGRESS__SWEEPER__ENABLED": "false",
            "PIPELINE_INGRESS__SWEEPER__INTERVAL_S": "0.5",
            "PIPELINE_INGRESS__SWEEPER__UNPRODUCED_AFTER_S": "1",
            "PIPELINE_INGRESS__SWEEPER__PATIENCE_S": "30",
            "PIPELINE_INGRESS__SWEEPER__MAX_PATIENCE_S": "60",
            "PIPELINE_INGRESS__SWEEPER__LEASE_S": "2",
            "PIPELINE_INGRESS__SWEEPER__LANE_GROUPS": json.dumps({self.lane: self.group}),
            # INFO: a scenario that fails shows each member's assignments and revocations
            "PIPELINE_LOG_LEVEL": os.environ.get("FAULTS_LOG_LEVEL", "INFO"),
        }
        if bootstrap_servers is not None:
            env["PIPELINE_KAFKA__BOOTSTRAP_SERVERS"] = bootstrap_servers
        return env

    async def _spawn(self, name: str, *args: str) -> asyncio.subprocess.Process:
        log = (self.directory / f"{name}.log").open("ab")
        self._logs.append(log)
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "pipeline",
            *args,
            cwd=str(TESTS),
            env=self.env,
            stdout=log,
            stderr=log,
        )
        self._log_names[proc.pid] = f"{name}.log"
        return proc

    async def declare(self) -> None:
        """Create the lane's topics (main, retry tiers, dead letter) on the scenario's broker."""
        transport = create_transport(self.settings)
        delete_after_test(transport, self.spec.topic_names())
        delete_group_after(transport, self.group, self.spec.topic_names())  # joined by processes
        try:
            await apply(transport.admin(), [self.spec], 100_000, dry_run=False)
        finally:
            await transport.close()

    async def start(self, *, ingress: bool = True) -> None:
        """Declare the topics, start every process, and supervise the members and sweeper.

        Without ``ingress`` only the members run (the scenario produces to the lane itself). A
        start that fails stops what it started, so no process or log file outlives the test.
        """
        try:
            await self.declare()
            if ingress:  # the members mark rows processed in it: it exists before any starts
                log_store = SqliteLogStore(self.directory / "ingress.db")
                await log_store.open()
                await log_store.close()
            for slot in range(self.member_count):
                self.members[slot] = await self._member()
            if ingress:
                self.sweeper = await self._spawn("sweeper", "sweep", "--loop")
                await self.start_ingress()
        except BaseException:
            await self.stop()
            raise
        self._supervisor = asyncio.create_task(self._supervise())

    async def _member(self) -> asyncio.subprocess.Process:
        self._member_starts += 1
        return await self._spawn(
            f"member-{self._member_starts}",
            "consume",
            self.app,
            "--group",
            self.group,
            "-t",
            self.transport,
        )

    def log_names(self) -> dict[int, str]:
        """Each process's log file in ``directory``, by process id."""
        return dict(self._log_names)

    def decisions(self, keys: list[str], lines: int = 12) -> str:
        """The run guard's last decisions about each of ``keys``, from every member's log."""
        logs = {
            f"{name} pid {pid}": (self.directory / name)
            .read_text(encoding="utf-8", errors="replace")
            .splitlines()
            for pid, name in sorted(self._log_names.items(), key=lambda item: item[1])
            if name.startswith("member-")
        }
        out = ""
        for key in keys:
            needle = f"key {encode_key(key.encode())})"
            found = [
                f"{name}: {line}" for name, text in logs.items() for line in text if needle in line
            ]
            found.sort(key=lambda entry: entry.partition(": ")[2][:23])  # by time
            out += f"\n  decisions about {key}:" + "".join(f"\n    {e}" for e in found[-lines:])
        return out

    def warnings(self, lines: int = 10) -> str:
        """The last WARNING and ERROR lines of every process's log."""
        out = ""
        for name in sorted(set(self._log_names.values())):
            text = (self.directory / name).read_text(encoding="utf-8", errors="replace")
            found = [line for line in text.splitlines() if " WARNING " in line or " ERROR " in line]
            if found:
                out += f"\n  {name} warnings:" + "".join(f"\n    {e}" for e in found[-lines:])
        return out

    def member_logs(self, lines: int = 30) -> str:
        """The last lines above DEBUG of each running member's log, for a failure's message."""
        return "".join(
            log_tail(self.directory, self._log_names[proc.pid], lines, skip=" DEBUG ")
            for proc in self.members
            if proc is not None
        )

    async def start_ingress(self, timeout_s: float = 60.0) -> None:
        """Start ``pipeline ingress serve`` on the scenario's port and wait until it listens."""
        self.ingress = await self._spawn(*INGRESS, str(self.port))
        deadline = time.monotonic() + timeout_s
        while not await asyncio.to_thread(port_open, self.port):
            if self.ingress.returncode is not None:
                raise AssertionError(
                    f"ingress exited with {self.ingress.returncode} before listening on "
                    f"{self.port}{log_tail(self.directory, 'ingress.log')}"
                )
            if time.monotonic() > deadline:
                raise AssertionError(f"ingress not listening after {timeout_s}s")
            await asyncio.sleep(0.05)

    async def kill_ingress(self) -> None:
        """``kill -9`` the ingress, then start a new one on the same port and log store."""
        assert self.ingress is not None
        self._ingress_restarting = True
        try:
            await self._kill(self.ingress)
            await self.start_ingress()
        finally:
            self._ingress_restarting = False

    async def kill_member(self, slot: int) -> None:
        """``kill -9`` one member; wait until the supervisor has started its replacement."""
        victim = self.members[slot]
        assert victim is not None
        await self._kill(victim)
        await self._replaced(lambda: self.members[slot] is not victim)

    async def freeze_member(self, slot: int, seconds: float) -> None:
        """SIGSTOP one member for ``seconds``, then SIGCONT it.

        A frozen process is alive to the supervisor (it is not restarted) and silent to
        everything else: the brokers and Redis see its sessions, leases and liveness run out.
        """
        victim = self.members[slot]
        assert victim is not None
        victim.send_signal(signal.SIGSTOP)
        try:
            await asyncio.sleep(seconds)  # the fault's duration
        finally:
            victim.send_signal(signal.SIGCONT)

    async def kill_sweeper(self) -> None:
        """``kill -9`` the sweeper; wait until the supervisor has started its replacement."""
        victim = self.sweeper
        assert victim is not None
        await self._kill(victim)
        await self._replaced(lambda: self.sweeper is not victim)

    @staticmethod
    async def _replaced(done: Callable[[], bool], timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not done():
            assert time.monotonic() < deadline, "the supervisor did not restart the process"
            await asyncio.sleep(0.02)

    async def _supervise(self) -> None:
        while not self._stopping:
            for slot, proc in enumerate(self.members):
                if proc is not None and self._exited(proc, "member"):
                    self.members[slot] = await self._member()
                    self.restarts += 1
            if self.sweeper is not None and self._exited(self.sweeper, "sweeper"):
                self.sweeper = await self._spawn("sweeper", "sweep", "--loop")
            ingress = self.ingress
            restart = ingress is not None and not self._ingress_restarting
            if restart and ingress is not None and self._exited(ingress, "ingress"):
                self.ingress = await self._spawn(*INGRESS, str(self.port))
            await asyncio.sleep(0.05)

    def _exited(self, proc: asyncio.subprocess.Process, name: str) -> bool:
        """Whether ``proc`` has exited (noting a crash: an exit nobody here caused)."""
        if proc.returncode is None or self._stopping:
            return False
        if proc.pid not in self._killed:
            self.crashes.append(f"{name} exit {proc.returncode}")
        return True

    def member_pids(self) -> list[int]:
        """Process ids of the running members."""
        return [p.pid for p in self.members if p is not None and p.returncode is None]

    async def stop(self) -> None:
        """Stop everything with SIGKILL: the scenario is over and its state is thrown away."""
        self._stopping = True
        if self._supervisor is not None:
            self._supervisor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._supervisor
        for proc in [self.ingress, self.sweeper, *self.members]:
            if proc is not None:
                await self._kill(proc)
        for log in self._logs:
            log.close()

    async def _kill(self, proc: asyncio.subprocess.Process) -> None:
        """``kill -9`` ``proc`` (remembered, so it does not count as a crash) and reap it."""
        self._killed.add(proc.pid)
        if proc.returncode is None:
            proc.send_signal(signal.SIGKILL)
        await proc.wait()


def log_tail(directory: Path, name: str, lines: int = 40, *, skip: str | None = None) -> str:
    """The last ``lines`` lines of one process log (those without ``skip``), for a failure."""
    log = directory / name
    if not log.exists():
        return ""
    text = log.read_text(encoding="utf-8", errors="replace").splitlines()
    tail = [line for line in text if skip is None or skip not in line][-lines:]
    return f"\n  {name}:" + "".join(f"\n    {line}" for line in tail)
