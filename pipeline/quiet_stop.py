"""uvicorn's server without its stop signal raised once more: a clean stop exits 0.

uvicorn raises a SIGTERM or SIGINT it caught once more when it has shut down, so that the
process dies of it: after a clean stop a server ended killed by SIGTERM (-15 to its parent, a
container in "Error" on every rollout), and a process that had more to stop after serving (the
ingress: its queued events, its log store) was killed before it could. The servers of
``pipeline ingress serve`` and ``pipeline registry serve`` subclass :class:`QuietStop` and note
the signal in their ``handle_exit``.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

import uvicorn

__all__ = ["QuietStop"]


class QuietStop(uvicorn.Server):
    """A uvicorn server whose caught stop signals end serving and are not raised again."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        """Turn SIGTERM and SIGINT into uvicorn's graceful shutdown while serving."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        stops = (signal.SIGTERM, signal.SIGINT)
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in stops}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
