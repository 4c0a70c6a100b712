"""``pipeline ingress serve --workers N``: N ingress processes on one port, one supervisor.

Each worker is a whole ingress (app, log store pool, producer, dispatcher, sweeper) in a process
of its own, listening on the same ``host:port`` with ``SO_REUSEPORT``: the kernel spreads new
connections over the workers' accept queues, so no process hands requests to another. They share
the PostgreSQL log store the way several hosts behind a load balancer do: the unique
``(source, event id)`` constraint deduplicates across them, and their sweepers claim rows with
``FOR UPDATE SKIP LOCKED`` and a lease, so a row is never swept by two at once. SQLite is one
process's file: ``--workers`` above 1 with it is refused before anything starts.

The supervisor (the process the command started) checks the configuration and the port, opens
the log database and checks the topics' size limits as a single ingress does before it listens
(:meth:`~pipeline.ingress.service.Ingress.preflight`: a failure is one line, no worker started),
holds the port (bound, not listening, so ``--port 0`` resolves once for every worker), starts the
workers, and prints ``ingress listening on ...`` once all are listening. Then:

* SIGTERM or SIGINT: SIGTERM to every worker (each drains like a single ingress: uvicorn's
  graceful shutdown, queued events produced, pools closed), SIGKILL to any still alive
  :data:`STOP_MARGIN_S` after their own stop bound (``PIPELINE_INGRESS__STOP_WITHIN_S``); exit 0.
  A further SIGTERM or SIGINT meanwhile is passed on to every worker, which takes it as a single
  ingress takes a second signal (a second Ctrl-C ends the wait for the requests in flight).
* SIGUSR1: passed on to every listening worker, which writes its threads' and tasks' stacks to
  stderr, in one piece (the dumps follow one another), and goes on
  (:mod:`pipeline.observability.stacks`).
* a worker that exits on its own after it was listening is started again (a warning line);
  more than :data:`MAX_RESTARTS` exits within :data:`RESTART_WINDOW_S` stop every worker and exit
  1 (a crash loop is not hidden).
* a worker that exits before it was listening (a database or broker that refuses it) stops every
  worker; the supervisor exits with that worker's code (1 if it had none).

With ``PIPELINE_INGRESS__METRICS_PORT=P`` worker *i* serves ``/metrics`` on port P + *i*.
Without it the webhook port answers ``/metrics`` 404 saying so (the supervisor warns once at
start): the kernel hands each scrape to any worker, so a scraper read one worker's counters, then
another's. ``/healthz`` and ``/readyz`` stay on the webhook port, each worker answering for itself;
its snapshot, served nowhere, is not refreshed (no lag asked of the broker, no backlog of the log).

Workers run in their own process group (a terminal's Ctrl-C reaches the supervisor only, which
stops them once) and, on Linux, get SIGTERM if the supervisor dies (``PR_SET_PDEATHSIG``), so a
``kill -9`` of the supervisor leaves no worker behind.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import multiprocessing
import os
import signal
import socket
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from pipeline.errors import ConfigError
from pipeline.ingress.service import HOST_VARIABLE, PORT_VARIABLE
from pipeline.reachability import listen_error

if TYPE_CHECKING:
    from collections.abc import Awaitable

    from pipeline.ingress.app import Receive, Scope, Send

    ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

log = logging.getLogger(__name__)

STOP_MARGIN_S = 5.0
"""What stopped workers get beyond their stop bound before SIGKILL (each ends by itself within
``ingress.stop_within_s``): room to exit."""
MAX_RESTARTS = 5
"""Most worker exits tolerated within :data:`RESTART_WINDOW_S` before the supervisor gives up."""
RESTART_WINDOW_S = 60.0
_PR_SET_PDEATHSIG = 1


@dataclass(frozen=True, slots=True)
class WorkerArgs:
    """What a worker needs beyond the environment (which it reads itself, like the command)."""

    host: str
    port: int
    sources: Path | None
    transport: str | None
    log_level: str
    log_format: str = "text"
    limits_checked: bool = False
    """The supervisor checked the topics' size limits (:meth:`Ingress.preflight`)."""


def refuse_sqlite(workers: int, log_store: str) -> None:
    """One line (ConfigError) when several workers would share an SQLite file."""
    if workers > 1 and log_store != "postgres":
        raise ConfigError(
            f"--workers {workers} needs the PostgreSQL log store: SQLite is one process's file; "
            "run one worker, or set PIPELINE_INGRESS__LOG_STORE=postgres "
            "(and PIPELINE_POSTGRES__URL)"
        )


def reuse_port_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` with ``SO_REUSEPORT``, not yet listening.

    A worker hands it to uvicorn, which listens once the ingress has started: until then the
    kernel gives the port's new connections to the workers already serving, never to one still
    starting (or one whose start fails, which would reset them).

    Raises:
        ConfigError: the address cannot be bound (a process without ``SO_REUSEPORT`` holds it,
            or ``host`` is no address of this machine).
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
        sock.setblocking(False)  # noqa: FBT003 - the socket API
    except OSError as exc:
        sock.close()
        raise listen_error(host, port, exc, PORT_VARIABLE, HOST_VARIABLE) from None
    return sock


def worker_main(index: int, args: WorkerArgs, ready: Connection, parent_pid: int) -> None:
    """A worker process: one ingress on a ``SO_REUSEPORT`` socket of ``args.host:args.port``."""
    os.setpgid(0, 0)  # a terminal's Ctrl-C goes to the supervisor, which stops us once
    _die_with(parent_pid)
    from pipeline import tracing  # noqa: PLC0415 - imported in the child only
    from pipeline.cli_support import run_command  # noqa: PLC0415
    from pipeline.log_repeats import configure_logging  # noqa: PLC0415

    # A spawned interpreter: the supervisor's logging and tracing are not inherited.
    configure_logging(args.log_level, args.log_format, worker=index)
    system = args.transport or os.environ.get("PIPELINE_TRANSPORT", "redis")
    tracing.configure(os.environ, service="pipeline-ingress", system=system)
    try:
        run_command(_serve_worker(index, args, ready), loop_factory=_uvloop())
    except typer.Exit as exc:  # run_command's exit for a pipeline error (its one line printed)
        sys.exit(exc.exit_code)
    finally:
        ready.close()


async def _serve_worker(index: int, args: WorkerArgs, ready: Connection) -> None:
    from pipeline.ingress.cli import worker_settings  # noqa: PLC0415 - avoids an import cycle
    from pipeline.ingress.service import build_ingress, serve  # noqa: PLC0415

    settings, ingress = worker_settings(args.transport, args.sources)
    if ingress.metrics_port:  # one metrics port per worker: METRICS_PORT + index
        ingress = ingress.model_copy(update={"metrics_port": ingress.metrics_port + index})
    built = build_ingress(settings, ingress)
    built.limits_checked = args.limits_checked
    if not ingress.metrics_port:
        built.snapshot_served = False
        built.app.observer = _without_metrics(built.observer)
    sock = reuse_port_socket(args.host, args.port)

    def announce(host: str, port: int) -> None:
        ready.send((host, port))

    try:
        await serve(built, args.host, args.port, announce, sock=sock)
    finally:
        sock.close()


_NO_SHARED_METRICS = (
    b"not served on the webhook port with --workers: each scrape would reach one worker's "
    b"counters, a different one each time; set PIPELINE_INGRESS__METRICS_PORT=P and scrape "
    b"worker i on port P + i\n"
)


def _without_metrics(observer: ASGIApp) -> ASGIApp:
    """``observer`` (``/metrics``, ``/healthz``, ``/readyz``) but for ``/metrics``: 404, why.

    On the shared webhook port the kernel hands each scrape's connection to any worker, so the
    counters a scraper read went up and down between the workers' own (Prometheus reads a drop
    as a restart, and its rates multiplied). The health endpoints stay: each answers for the
    worker that takes the connection, which is what a load balancer asks.
    """

    async def serve(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["path"] != "/metrics":
            await observer(scope, receive, send)
            return
        length = str(len(_NO_SHARED_METRICS)).encode()
        headers = [(b"content-type", b"text/plain; charset=utf-8"), (b"content-length", length)]
        await send({"type": "http.response.start", "status": 404, "headers": headers})
        await send({"type": "http.response.body", "body": _NO_SHARED_METRICS})

    return serve


def _uvloop() -> Callable[[], Any]:
    import uvloop  # noqa: PLC0415

    return uvloop.new_event_loop


def _die_with(parent_pid: int) -> None:
    """Get SIGTERM when the supervisor dies (Linux); exit now if it already has."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent_pid:
        os._exit(1)


@dataclass(slots=True)
class _Worker:
    index: int
    process: BaseProcess
    ready: Connection
    waiting: bool = True  # for its "listening" message
    listening: bool = False


@dataclass
class Supervisor:
    """Starts ``count`` workers and keeps them running until a signal (see the module doc)."""

    count: int
    args: WorkerArgs
    on_ready: Callable[[str, int], None]
    _workers: dict[int, _Worker] = field(default_factory=dict)
    _exits: deque[float] = field(default_factory=deque)
    _announced: bool = False
    _stop_grace_s: float = 0.0

    def run(self) -> int:
        """Serve until SIGTERM/SIGINT (0), a crash loop (1) or a worker that cannot start."""
        from pipeline.ingress.cli import worker_settings  # noqa: PLC0415 - avoids an import cycle

        # The settings the workers read: checked by the command before it got here.
        _, ingress = worker_settings(self.args.transport, self.args.sources)
        self._stop_grace_s = ingress.stop_within_s + STOP_MARGIN_S
        if not ingress.metrics_port:
            log.warning(
                "%d ingress workers without PIPELINE_INGRESS__METRICS_PORT: /metrics is not "
                "served (the webhook port answers it 404); set it to P and scrape worker i on "
                "port P + i",
                self.count,
            )
        context = multiprocessing.get_context("spawn")
        wake_r, wake_w = socket.socketpair()
        wake_w.setblocking(False)  # noqa: FBT003 - the socket API
        stopping: list[int] = []
        previous = {
            sig: signal.signal(sig, lambda signum, _frame: stopping.append(signum))
            for sig in (signal.SIGTERM, signal.SIGINT)
        }
        previous[signal.SIGUSR1] = signal.signal(signal.SIGUSR1, self._forward)
        old_wakeup = signal.set_wakeup_fd(wake_w.fileno())
        try:
            for index in range(self.count):
                self._start(context, index)
            code = self._watch(context, wake_r, stopping)
        finally:
            self._stop_all(wake_r, stopping)
            signal.set_wakeup_fd(old_wakeup)
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            wake_r.close()
            wake_w.close()
        return code

    def _forward(self, signum: int, _frame: object) -> None:
        """SIGUSR1 (a dump of the stacks) goes to every listening worker; this process has no loop.

        A worker still starting has no handler for it yet, and would die of it.
        """
        for worker in self._workers.values():
            if worker.listening and worker.process.pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(worker.process.pid, signum)

    def _start(self, context: Any, index: int) -> None:
        reader, writer = context.Pipe(duplex=False)
        process = context.Process(
            target=worker_main,
            args=(index, self.args, writer, os.getpid()),
            name=f"ingress-worker-{index}",
        )
        process.start()
        writer.close()
        self._workers[index] = _Worker(index, process, reader)

    def _watch(self, context: Any, wake: socket.socket, stopping: list[int]) -> int:
        while not stopping:
            readers = [w.ready for w in self._workers.values() if w.waiting]
            sentinels = {w.process.sentinel: w for w in self._workers.values()}
            for ready in wait([wake, *readers, *sentinels]):
                if ready is wake:
                    wake.recv(64)
                elif isinstance(ready, int):
                    code = self._exited(context, sentinels[ready])
                    if code is not None:
                        return code
                else:
                    self._listening(ready)
        log.info("ingress workers stopping (signal %d)", stopping[0])
        return 0

    def _listening(self, ready: Any) -> None:
        worker = next((w for w in self._workers.values() if w.ready is ready), None)
        if worker is None:  # replaced in this same round
            return
        worker.waiting = False
        try:
            host, port = worker.ready.recv()
        except EOFError:  # it exited before listening; its sentinel reports that
            return
        worker.listening = True
        if not self._announced and all(w.listening for w in self._workers.values()):
            self._announced = True
            self.on_ready(host, port)

    def _exited(self, context: Any, worker: _Worker) -> int | None:
        """Restart ``worker`` (None), or the supervisor's exit code when it must stop."""
        worker.process.join()
        code = worker.process.exitcode
        worker.ready.close()
        del self._workers[worker.index]
        if not worker.listening:
            log.error(
                "ingress worker %d exited with code %s before it was listening; stopping",
                worker.index,
                code,
            )
            return code if code and code > 0 else 1
        now = time.monotonic()
        self._exits.append(now)
        while self._exits and now - self._exits[0] > RESTART_WINDOW_S:
            self._exits.popleft()
        if len(self._exits) > MAX_RESTARTS:
            log.error(
                "ingress workers exited %d times within %.0f s; stopping them all",
                len(self._exits),
                RESTART_WINDOW_S,
            )
            return 1
        log.warning("ingress worker %d exited with code %s; starting it again", worker.index, code)
        self._start(context, worker.index)
        return None

    def _stop_all(self, wake: socket.socket, stopping: list[int]) -> None:
        """SIGTERM every worker, wait for them to drain, SIGKILL the ones that do not.

        A further SIGINT or SIGTERM meanwhile (a second Ctrl-C) is passed on to every worker,
        which takes it as a single ingress does: a SIGINT ends uvicorn's wait for the requests
        in flight, and either ends a worker already closing its log store and producer.
        """
        alive = [w for w in self._workers.values() if w.process.is_alive()]
        for worker in alive:
            worker.process.terminate()
        passed_on = 1 if stopping else 0  # the first stop signal is the SIGTERM just sent
        deadline = time.monotonic() + self._stop_grace_s
        while (running := [w for w in alive if w.process.is_alive()]) and (
            left := deadline - time.monotonic()
        ) > 0:
            for signum in stopping[passed_on:]:
                log.warning("ingress workers: signal %d again, passed on to every worker", signum)
                for worker in running:
                    if worker.process.pid is not None:
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(worker.process.pid, signum)
            passed_on = max(passed_on, len(stopping))
            if wake in wait([wake, *(w.process.sentinel for w in running)], timeout=left):
                wake.recv(64)
        for worker in alive:
            if worker.process.is_alive():
                log.error("ingress worker %d did not stop in time; killing it", worker.index)
                worker.process.kill()
            worker.process.join()
        for worker in self._workers.values():
            worker.ready.close()
        self._workers.clear()
