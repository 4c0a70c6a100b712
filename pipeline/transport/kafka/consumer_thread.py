"""One daemon thread that runs every call into a librdkafka consumer, in order.

A thread of :mod:`concurrent.futures` is joined when the interpreter exits, so a librdkafka call
that never returns (a consumer close stuck in a rebalance) would keep the process alive; this
thread is a daemon and cannot.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any


class ConsumerThread:
    """Runs submitted calls one at a time on a daemon thread."""

    def __init__(self, name: str) -> None:
        """Start the thread."""
        self._calls: queue.SimpleQueue[
            tuple[Future[Any], Callable[..., Any], tuple[Any, ...]] | None
        ]
        self._calls = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future[Any]:
        """Queue ``fn(*args)``; the future settles with its result or exception."""
        future: Future[Any] = Future()
        self._calls.put((future, fn, args))
        return future

    def pending(self) -> bool:
        """Whether calls wait behind the running one (a long poll should yield to them)."""
        return not self._calls.empty()

    def _serve(self) -> None:
        while (call := self._calls.get()) is not None:
            future, fn, args = call
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn(*args))
            except BaseException as exc:
                future.set_exception(exc)

    def stop(self) -> None:
        """Let the thread end after the calls already queued."""
        self._calls.put(None)
