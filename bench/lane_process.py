"""One consumer of a lane as its own process, timed by the bytes its handler writes.

The process benchmarks (``bench/guarded.py``, ``bench/peers_bench.py``) run a consumer the way a
user does: :func:`write_lane` writes the lane's yaml (``topics/<name>.yaml``) and the app module
(a copy of ``bench/lane_app.py`` as ``bench_lane_app.py``) into a fresh directory, and the
consumer starts with that directory as its working directory, either as

* ``pipeline consume bench_lane_app:app --group G`` (:func:`consume_cmd`: the real CLI entry,
  the configuration from ``PIPELINE_*`` variables), or
* a bare :class:`~pipeline.runtime.member.Member` without Redis (:func:`bare_cmd`: this file's
  ``--bare`` mode, the runtime settings from the same variables).

:func:`drain` gives the handler the write end of a pipe (``BENCH_OUT_FD``); a thread here reads
it and counts bytes. The timed span runs from the first byte to the ``expected``-th, so process
start, imports and the group join are outside it; the CPU time of the consumer's process tree
(psutil) is read at both ends, whole and split between its main thread, its other threads and
its child processes (:class:`CpuParts`). :class:`PrivateRedis` is a ``redis-server`` of the
run's own on a free loopback port, so ``INFO commandstats`` before and after counts only that
consumer's commands.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import psutil
from ingress import free_port

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

HERE = Path(__file__).resolve().parent
APP_FILE = HERE / "lane_app.py"
APP_MODULE = "bench_lane_app"
PIPELINE_CLI = Path(sys.executable).parent / "pipeline"
STOP_GRACE_S = 20.0
REDIS_START_S = 10.0


class ProcessBenchError(Exception):
    """A consumer process failed, stopped early or did not finish in time."""


# -- a private Redis -----------------------------------------------------------------------------


class PrivateRedis:
    """``redis-server`` on a free loopback port, configured as ``deploy/local/redis.sh`` does."""

    def __init__(self, directory: Path) -> None:
        """Keep the server's files in ``directory``; nothing starts yet."""
        self.directory = directory
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """The server's Redis URL."""
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        """Start the server and wait until it answers PING."""
        self.directory.mkdir(parents=True, exist_ok=True)
        # appendonly + everysec, no RDB snapshots: the same durability as the shared server.
        self.process = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "yes",
                "--appendfsync",
                "everysec",
                "--dir",
                str(self.directory),
                "--daemonize",
                "no",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + REDIS_START_S
        while True:
            with contextlib.suppress(OSError):
                if self._ask(b"PING\r\n").startswith(b"+PONG"):
                    return
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise ProcessBenchError(f"private redis-server on port {self.port} did not start")
            time.sleep(0.05)

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL after 10 s)."""
        if self.process is None:
            return
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.process = None

    def _ask(self, command: bytes) -> bytes:
        """Send one inline command on a fresh connection and return the whole reply.

        A raw socket, not redis-py: redis-py sends ``CLIENT SETINFO`` on connect, which would
        count in the consumer's figures.
        """
        with socket.create_connection(("127.0.0.1", self.port), timeout=2.0) as sock:
            sock.sendall(command)
            data = sock.recv(65536)
            if data.startswith(b"$"):  # a bulk string: $<len>\r\n<body>\r\n
                head, _, body = data.partition(b"\r\n")
                size = int(head[1:])
                while len(body) < size + 2:
                    chunk = sock.recv(65536)
                    if not chunk:
                        break
                    body += chunk
                return body[:size]
            return data

    def commandstats(self) -> dict[str, int]:
        """Calls per command so far (``INFO commandstats``), e.g. ``{"fcall": 812, ...}``."""
        calls: dict[str, int] = {}
        for line in self._ask(b"INFO commandstats\r\n").decode().splitlines():
            if line.startswith("cmdstat_"):
                name, _, fields = line.removeprefix("cmdstat_").partition(":")
                stats = dict(f.split("=", 1) for f in fields.split(","))
                calls[name] = int(stats["calls"])
        return calls


def calls_between(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    """Calls per command between two snapshots, without the snapshots' own INFO calls.

    ``INFO commandstats`` also counts the commands a function or script runs inside
    (an FCALL whose function calls HSET twice counts fcall 1 and hset 2).
    """
    delta = {name: after[name] - before.get(name, 0) for name in after if name != "info"}
    return {name: n for name, n in sorted(delta.items()) if n}


# -- the lane's directory ------------------------------------------------------------------------


def write_lane(directory: Path, spec: dict[str, Any]) -> Path:
    """Write ``topics/<name>.yaml`` and the app module into ``directory``; returns it."""
    (directory / "topics").mkdir(parents=True, exist_ok=True)
    # JSON is YAML: the declaration as `pipeline topics apply` reads it.
    (directory / "topics" / f"{spec['name']}.yaml").write_text(json.dumps(spec), encoding="utf-8")
    copy_app(directory)
    return directory


def copy_app(directory: Path) -> None:
    """Copy ``bench/lane_app.py`` into ``directory`` as the importable ``bench_lane_app``."""
    shutil.copyfile(APP_FILE, directory / f"{APP_MODULE}.py")


def consume_cmd(group: str, *extra: str) -> list[str]:
    """``pipeline consume bench_lane_app:app --group GROUP`` (run in the lane's directory)."""
    return [str(PIPELINE_CLI), "consume", f"{APP_MODULE}:app", "--group", group, *extra]


def bare_cmd(group: str) -> list[str]:
    """A bare member (no Redis, no metrics) of ``group`` (run in the lane's directory)."""
    return [sys.executable, str(Path(__file__).resolve()), "--bare", f"{APP_MODULE}:app", group]


# -- the run -------------------------------------------------------------------------------------


def tree_cpu_s(proc: psutil.Process) -> float:
    """CPU seconds of a process and its descendants."""
    total = 0.0
    for p in [proc, *proc.children(recursive=True)]:
        with contextlib.suppress(psutil.NoSuchProcess):
            t = p.cpu_times()
            total += t.user + t.system + t.children_user + t.children_system
    return total


CpuPart = Literal["main", "threads", "children"]
CPU_PARTS: tuple[CpuPart, ...] = ("main", "threads", "children")


@dataclass(frozen=True, slots=True)
class CpuParts:
    """CPU seconds of a consumer split three ways.

    Its main thread (the event loop, where every stage runs), its other threads (the Kafka
    client's, the span shipper's, librdkafka's) and its child processes (the exporting process
    of traced runs). Read from ``/proc`` in clock ticks (10 ms), as the process tree's total: at
    20,000 messages a reading is good to about 0.5 µs a message.
    """

    main: float = 0.0
    threads: float = 0.0
    children: float = 0.0

    def __sub__(self, other: CpuParts) -> CpuParts:
        """The CPU used between ``other`` and this reading."""
        return CpuParts(
            self.main - other.main, self.threads - other.threads, self.children - other.children
        )


def cpu_parts(proc: psutil.Process) -> CpuParts:
    """The consumer's :class:`CpuParts` now (threads of the process itself, from ``/proc``)."""
    main = threads = children = 0.0
    with contextlib.suppress(psutil.NoSuchProcess):
        for t in proc.threads():
            used = t.user_time + t.system_time
            if t.id == proc.pid:
                main += used
            else:
                threads += used
        for child in proc.children(recursive=True):
            with contextlib.suppress(psutil.NoSuchProcess):
                c = child.cpu_times()
                children += c.user + c.system
    return CpuParts(main, threads, children)


@dataclass(slots=True)
class Drain:
    """One consumer process over a backlog: the span from the first byte to the last."""

    messages: int
    seconds: float
    cpu_s: float
    stats: dict[str, Any] = field(default_factory=dict)
    """What the handler counted (``checked`` mode) and what the harness added."""
    redis_calls: dict[str, int] | None = None
    parts: CpuParts = CpuParts()
    """``cpu_s`` split between the main thread, the other threads and child processes."""

    def us_per_msg(self, part: CpuPart) -> float:
        """One of :attr:`parts` in µs per message."""
        return float(getattr(self.parts, part)) * 1e6 / self.messages

    @property
    def msgs_s(self) -> float:
        """Throughput over the span."""
        return self.messages / self.seconds

    @property
    def cpu_per_10k(self) -> float:
        """The consumer process tree's CPU-seconds per 10,000 messages."""
        return self.cpu_s * 10_000 / self.messages

    @property
    def redis_calls_per_msg(self) -> float | None:
        """Redis commands (commandstats, without INFO) per message."""
        if self.redis_calls is None:
            return None
        return sum(self.redis_calls.values()) / self.messages


class ByteCounter(threading.Thread):
    """Reads the handler's pipe until EOF; notes time and CPU at the first and ``expected``-th."""

    def __init__(self, fd: int, expected: int, proc: psutil.Process) -> None:
        """Count the bytes of ``fd``; ``proc`` is the consumer whose CPU time is read."""
        super().__init__(daemon=True)
        self.fd = fd
        self.expected = expected
        self.proc = proc
        self.count = 0
        self.t0 = self.t1 = self.cpu0 = self.cpu1 = 0.0
        self.parts0 = self.parts1 = CpuParts()
        self.done = threading.Event()

    def run(self) -> None:
        """Read until the writer is gone."""
        while chunk := os.read(self.fd, 65536):
            if self.count == 0:
                self.t0, self.cpu0 = time.perf_counter(), tree_cpu_s(self.proc)
                self.parts0 = cpu_parts(self.proc)
            self.count += len(chunk)
            if self.count >= self.expected and not self.done.is_set():
                self.t1, self.cpu1 = time.perf_counter(), tree_cpu_s(self.proc)
                self.parts1 = cpu_parts(self.proc)
                self.done.set()


def stop_process(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the process group (a graceful stop), SIGKILL after a grace period."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


async def drain(
    label: str,
    cmd: list[str],
    workdir: Path,
    env: dict[str, str],
    expected: int,
    timeout_s: float,
    *,
    settle: Callable[[], Awaitable[dict[str, Any]]] | None = None,
    redis: PrivateRedis | None = None,
) -> Drain:
    """Run ``cmd`` in ``workdir`` until its handler wrote ``expected`` bytes, then stop it.

    ``settle``, if given, runs after the last byte and before the stop (for example: wait until
    the group's commits cover every topic); what it returns is added to the stats. With
    ``redis``, ``INFO commandstats`` is read before the start and after the process exited.
    """
    stats_path = workdir / "stats.json"
    log_path = workdir / "consumer.log"
    read_fd, write_fd = os.pipe()
    env = {**env, "BENCH_OUT_FD": str(write_fd), "BENCH_STATS": str(stats_path)}
    before = redis.commandstats() if redis else None
    with log_path.open("wb") as log:
        proc = subprocess.Popen(  # noqa: ASYNC220 - returns at once
            cmd,
            cwd=workdir,
            env=env,
            pass_fds=(write_fd,),
            stdout=subprocess.DEVNULL,
            stderr=log,
            start_new_session=True,
        )
    os.close(write_fd)
    counter = ByteCounter(read_fd, expected, psutil.Process(proc.pid))
    counter.start()
    extra: dict[str, Any] = {}
    try:
        deadline = time.monotonic() + timeout_s
        while not counter.done.is_set():
            if proc.poll() is not None:
                raise ProcessBenchError(
                    f"{label}: exited {proc.returncode} after {counter.count} of {expected} "
                    f"messages{log_tail(log_path)}"
                )
            if time.monotonic() > deadline:
                raise ProcessBenchError(
                    f"{label}: {counter.count} of {expected} messages in {timeout_s:.0f} s"
                    f"{log_tail(log_path)}"
                )
            await asyncio.sleep(0.01)
        if settle is not None:
            extra = await settle()
    finally:
        await asyncio.to_thread(stop_process, proc)
        await asyncio.to_thread(counter.join, 10)
        os.close(read_fd)
    if proc.returncode == -signal.SIGKILL:  # the stop's grace ran out: say what it was doing
        print(
            f"  warning: {label} did not stop within {STOP_GRACE_S:.0f} s of SIGTERM and was"
            f" killed{log_tail(log_path, 12)}",
            file=sys.stderr,
            flush=True,
        )
    result = Drain(
        expected,
        counter.t1 - counter.t0,
        counter.cpu1 - counter.cpu0,
        parts=counter.parts1 - counter.parts0,
    )
    if stats_path.exists():
        result.stats = json.loads(stats_path.read_text(encoding="utf-8"))
    result.stats |= extra | {"bytes_after_stop": counter.count, "exit_code": proc.returncode}
    if redis is not None and before is not None:
        result.redis_calls = calls_between(before, redis.commandstats())
    return result


def log_tail(log: Path, count: int = 3) -> str:
    """The last ``count`` lines of ``log`` as ``" (stderr: a | b)"``, or nothing."""
    lines = log.read_text(errors="replace").strip().splitlines()[-count:] if log.exists() else []
    return f" (stderr: {' | '.join(lines)})" if lines else ""


# -- the bare member's process --------------------------------------------------------------------


async def _bare(target: str, group: str) -> None:
    """A member of ``group`` without Redis or metrics; stops on SIGTERM."""
    from pipeline.config import load_settings  # noqa: PLC0415 - the bare process only
    from pipeline.runtime.member import Member  # noqa: PLC0415
    from pipeline.runtime.run import load_app  # noqa: PLC0415
    from pipeline.transport import create_transport  # noqa: PLC0415

    settings = load_settings()
    app = load_app(target)
    transport = create_transport(settings)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    try:
        await Member(app, transport, group, settings.runtime).run(stop)
    finally:
        await transport.close()


if __name__ == "__main__":
    if sys.argv[1:2] != ["--bare"] or len(sys.argv) != 4:
        sys.exit("usage: lane_process.py --bare MODULE:APP GROUP")
    asyncio.run(_bare(sys.argv[2], sys.argv[3]))
