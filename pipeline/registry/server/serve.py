"""Running the registry under uvicorn: in the foreground (CLI) or on a background thread.

:func:`serve` runs it in the foreground until SIGTERM or SIGINT, then returns which signal
stopped it: the command exits 0 after a clean stop, as ``pipeline ingress serve`` does.
:class:`BackgroundServer` serves an app on an ephemeral loopback port in a thread and returns
once the socket is bound and ``GET /`` answers, so tests and benchmarks never sleep to wait.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from types import FrameType, TracebackType
from typing import Self

import httpx
import uvicorn
from starlette.applications import Starlette

from pipeline.quiet_stop import QuietStop
from pipeline.registry.errors import RegistryError

_POLL_S = 0.01
_SERVER_ERROR = 500


def uvicorn_config(app: Starlette, host: str, port: int) -> uvicorn.Config:
    """The uvicorn settings for the registry: no websockets, no access log, no lifespan."""
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        ws="none",
        lifespan="off",
        access_log=False,
        log_level="warning",
        log_config=None,  # its loggers propagate: the process's format and trace fields
    )


def bound_port(server: uvicorn.Server) -> int:
    """The port a started uvicorn server listens on (the real one when asked for port 0)."""
    sockets = [s for srv in server.servers for s in srv.sockets]
    return int(sockets[0].getsockname()[1])


class _Server(QuietStop):
    """uvicorn's server, which does not raise the stop signal again once it has served.

    uvicorn raises a SIGTERM or SIGINT it caught once more when it has shut down, so that the
    process dies of it: after a clean stop the registry ended killed by SIGTERM (-15 to its
    parent, a container in "Error" on every rollout). It notes the signal and returns instead.
    """

    stopped_by: signal.Signals | None = None
    """The first stop signal that came; None before."""

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        """Note the first stop signal, then shut down as uvicorn does (a second SIGINT forces)."""
        if self.stopped_by is None:
            self.stopped_by = signal.Signals(sig)
        super().handle_exit(sig, frame)


def serve(
    app: Starlette, host: str, port: int, on_ready: Callable[[int], None]
) -> signal.Signals | None:
    """Serve ``app`` in the foreground until interrupted; ``on_ready(port)`` once listening.

    Returns:
        The signal (SIGTERM or SIGINT) the server stopped on, once it has shut down; None when
        it ended otherwise. The signal is not raised again: the caller exits as it sees fit.
    """
    server = _Server(uvicorn_config(app, host, port))

    def announce() -> None:
        while not server.started and not server.should_exit:
            time.sleep(_POLL_S)
        if server.started:
            on_ready(bound_port(server))

    threading.Thread(target=announce, daemon=True).start()
    server.run()
    return server.stopped_by


class BackgroundServer:
    """uvicorn serving ``app`` on a thread, on 127.0.0.1 and a free port."""

    def __init__(
        self, app: Starlette, *, host: str = "127.0.0.1", start_timeout_s: float = 30.0
    ) -> None:
        """Prepare (not start) the server."""
        self._server = uvicorn.Server(uvicorn_config(app, host, 0))
        self._host = host
        self._timeout_s = start_timeout_s
        self._thread = threading.Thread(target=self._server.run, name="registry", daemon=True)
        self.url = ""

    def start(self) -> str:
        """Start serving and wait until ``GET /`` answers; return the base URL.

        Raises:
            RegistryError: the server did not come up within the start timeout.
        """
        self._thread.start()
        deadline = time.monotonic() + self._timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RegistryError("the registry server did not start")
            time.sleep(_POLL_S)  # polling a readiness flag, not sleeping as synchronisation
        self.url = f"http://{self._host}:{bound_port(self._server)}"
        with httpx.Client(timeout=1.0) as client:
            while True:
                try:
                    if client.get(self.url + "/").status_code < _SERVER_ERROR:
                        return self.url
                except httpx.TransportError:
                    pass
                if time.monotonic() > deadline:
                    raise RegistryError("the registry server did not answer")
                time.sleep(_POLL_S)

    def stop(self) -> None:
        """Stop serving and wait for the thread to end."""
        self._server.should_exit = True
        self._thread.join(timeout=self._timeout_s)

    def __enter__(self) -> Self:
        """Start; see :meth:`start`."""
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Stop; see :meth:`stop`."""
        self.stop()
