"""The ingress's promise to end by its stop bound, kept whatever holds the process.

:meth:`~pipeline.ingress.service.Ingress.stop` bounds each step of a stop, but the process can
still be held after it: the event loop's close and the interpreter's exit wait for every
non-daemon thread, and a thread inside a call that does not return (a library's blocking
request to a service that does not answer, a write to a disk that hangs) holds them until that
call returns. :func:`exit_by` arms a daemon timer at the stop signal: a process still alive at
the bound logs one line naming the threads still running and exits with status 1. What the log
holds is durable by then (every answered webhook was committed before its answer), and events
left unproduced stay ``received`` for a sweeper.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time

__all__ = ["exit_by"]

log = logging.getLogger(__name__)


def exit_by(deadline: float, setting: str) -> None:
    """End the process at ``deadline`` (``time.monotonic()``) if it is still alive then.

    ``setting`` names the bound in the line logged (the variable an operator would change).
    """

    def expire() -> None:
        here = threading.current_thread()
        main = threading.main_thread()
        held = sorted(
            t.name for t in threading.enumerate() if t not in (here, main) and not t.daemon
        )
        log.error(
            "still running at the stop bound (%s), held by threads: %s; exiting now with status 1",
            setting,
            ", ".join(held) or "none (the interpreter's own exit)",
        )
        for handler in logging.getLogger().handlers:
            handler.flush()
        sys.stderr.flush()
        os._exit(1)

    timer = threading.Timer(max(0.0, deadline - time.monotonic()), expire)
    timer.name = "stop-bound"
    timer.daemon = True
    timer.start()
