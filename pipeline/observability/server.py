"""``/metrics`` from a cached snapshot, ``/healthz`` and ``/readyz``, as a plain ASGI app.

A scrape returns the bytes rendered by the last refresh and never waits: the expensive readings
(group lag from Kafka or Redis, log-store ages) run only in :meth:`MetricsServer.run`, every
``interval_s``, each :class:`~pipeline.observability.sources.SnapshotSource` under a timeout.
A source that fails or hangs is counted in ``pipeline_metrics_refresh_errors_total`` and keeps
its previous values (a pipeline error, such as a broker that is down, is logged as one warning
line; any other exception with its traceback); ``pipeline_metrics_refresh_timestamp_seconds``
moves only when every source succeeded, so a stale snapshot is visible (and alerted on).

* ``GET /metrics``: the snapshot, Prometheus text format 0.0.4.
* ``GET /healthz``: 200 while the process serves requests (liveness).
* ``GET /readyz``: 200 once the owner set :attr:`MetricsServer.ready` (a member joined its
  group, an ingress opened its log store), else 503 (readiness).

Mount it beside another ASGI app (the ingress does) or run it alone with :func:`serve_metrics`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Any

import uvicorn
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from pipeline.errors import PipelineError
from pipeline.observability import metrics as m
from pipeline.observability.answers import TEXT_PLAIN, Headers
from pipeline.observability.metrics import Metrics
from pipeline.observability.metrics_http import metrics_protocol
from pipeline.observability.sources import SnapshotSource
from pipeline.reachability import listen_error

log = logging.getLogger(__name__)

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

PATHS = frozenset({"/metrics", "/healthz", "/readyz"})
"""The paths this app answers."""

_EXPOSITION = (b"content-type", CONTENT_TYPE_LATEST.encode())


class MetricsServer:
    """Serves a snapshot of ``metrics`` refreshed in the background from ``sources``."""

    def __init__(
        self,
        metrics: Metrics,
        sources: Sequence[SnapshotSource] = (),
        *,
        interval_s: float = 15.0,
        source_timeout_s: float = 10.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """Refresh every ``interval_s``; give each source at most ``source_timeout_s``."""
        self.metrics = metrics
        self.sources = list(sources)
        self.ready = False
        """Whether ``/readyz`` answers 200; set by the owner."""
        self._interval_s = interval_s
        self._timeout_s = source_timeout_s
        self._clock = clock
        self._errors = metrics.counter(m.REFRESH_ERRORS)
        self._stamp = metrics.gauge(m.REFRESH_TIMESTAMP)
        self._snapshot = generate_latest(metrics.registry)
        self._task: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()

    @property
    def snapshot(self) -> bytes:
        """The last rendered exposition."""
        return self._snapshot

    async def refresh_once(self) -> bool:
        """Refresh every source (concurrently, each under the timeout), then render.

        Returns:
            True when every source succeeded.
        """
        results = await asyncio.gather(*(self._refresh(source) for source in self.sources))
        complete = all(results)
        if complete:
            self._stamp.set(self._clock())
        self._snapshot = generate_latest(self.metrics.registry)
        return complete

    async def _refresh(self, source: SnapshotSource) -> bool:
        try:
            # In this task, not one of wait_for's own: a refresh cancelled with the refresher
            # (the server closing) whose client raised on the way out left its error unread,
            # and asyncio logged "Task exception was never retrieved" with its traceback.
            async with asyncio.timeout(self._timeout_s):
                await source.refresh()
        except TimeoutError:
            log.warning("metrics source %s timed out after %.1fs", source.name, self._timeout_s)
        except PipelineError as exc:  # a service down or refusing: its message says which, where
            log.warning("metrics source %s failed: %s", source.name, exc)
        except Exception:
            log.exception("metrics source %s failed", source.name)  # a bug: its traceback
        else:
            return True
        self._errors.labels(source.name).inc()
        return False

    async def run(self, stop: asyncio.Event) -> None:
        """Refresh every ``interval_s`` until ``stop`` is set."""
        while not stop.is_set():
            await self.refresh_once()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self._interval_s)

    def start(self) -> None:
        """Start :meth:`run` as a task of the running loop (idempotent)."""
        if self._task is None:
            self._stop = asyncio.Event()
            self._task = asyncio.create_task(self.run(self._stop))

    async def close(self) -> None:
        """Stop the refresher task started by :meth:`start`."""
        if self._task is not None:
            self._stop.set()
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The ASGI entry point (HTTP only; lifespan belongs to the owner)."""
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        await _send(send, *self.answer(scope["method"], scope["path"]))

    def answer(self, method: str, path: str) -> tuple[int, bytes, Headers]:
        """The status, body and headers (without Content-Length) of ``method path``."""
        if method not in {"GET", "HEAD"}:
            return 405, b"method not allowed\n", [TEXT_PLAIN, (b"allow", b"GET, HEAD")]
        if path == "/metrics":
            return 200, self._snapshot, [_EXPOSITION]
        if path == "/healthz":
            return 200, b"ok\n", [TEXT_PLAIN]
        if path == "/readyz":
            status, body = (200, b"ready\n") if self.ready else (503, b"not ready\n")
            return status, body, [TEXT_PLAIN]
        return 404, b"not found\n", [TEXT_PLAIN]


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


async def _send(send: Send, status: int, body: bytes, headers: Headers) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [*headers, (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})


class _Server(uvicorn.Server):
    """A uvicorn server that leaves SIGTERM and SIGINT to the process that embeds it."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        """Install no signal handlers: the owner's graceful shutdown must receive them."""
        yield


def metrics_socket(host: str, port: int, variable: str, host_variable: str) -> socket.socket:
    """A socket bound to ``host:port`` for :func:`serve_metrics`, bound as uvicorn binds.

    Binding it before anything else starts lets a process that cannot listen there stop at
    once, in one line naming ``variable`` (the port's setting) or ``host_variable``.

    Raises:
        ConfigError: the port is held by another process, needs privileges, or the address is
            not one of this machine's.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise listen_error(host, port, exc, variable, host_variable, " for /metrics") from None
    return sock


async def serve_metrics(
    server: MetricsServer,
    host: str,
    port: int,
    stop: asyncio.Event,
    on_ready: Callable[[str, int], None] | None = None,
    *,
    sock: socket.socket | None = None,
) -> None:
    """Serve ``server`` on ``host:port`` with uvicorn and run its refresher until ``stop``.

    Through :class:`~pipeline.observability.metrics_http.MetricsProtocol`: at most
    :data:`~pipeline.observability.metrics_http.MAX_CONNECTIONS` connections, each request due
    within :data:`~pipeline.observability.metrics_http.REQUEST_WITHIN_S`.

    For processes without an HTTP server of their own (a consumer-group member). Port 0 picks
    a free port; ``on_ready(host, port)`` is called once it listens. ``sock``: a socket
    :func:`metrics_socket` bound to ``host:port`` already (it is closed when serving ends).
    """
    config = uvicorn.Config(
        server,
        host=host,
        port=port,
        loop="none",
        http=metrics_protocol(server),
        lifespan="off",
        access_log=False,
        log_level="warning",
        log_config=None,  # its loggers propagate: the process's format, trace and worker fields
    )
    http = _Server(config)
    server.start()
    serving = asyncio.create_task(http.serve(sockets=None if sock is None else [sock]))
    try:
        while not http.started and not serving.done():  # noqa: ASYNC110 - uvicorn has no started event
            await asyncio.sleep(0.01)
        if not http.started:
            raise OSError(f"metrics server could not listen on {host}:{port}")
        if on_ready is not None:
            bound = http.servers[0].sockets[0].getsockname()
            on_ready(bound[0], bound[1])
        await stop.wait()
    finally:
        http.should_exit = True
        with contextlib.suppress(asyncio.CancelledError):
            await serving
        await server.close()
        if sock is not None:
            sock.close()
