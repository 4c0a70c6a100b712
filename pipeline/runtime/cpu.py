"""A kill-able process pool for CPU-bound handlers, so the event loop stays free.

A CPU-bound handler is a plain (``def``) module-level function registered with
``@app.handler("lane", cpu=True, time_limit_s=30)``. It runs in one of ``size`` worker processes
started with ``forkserver`` (never forked from the member, whose client libraries run threads).
A call past its time limit kills its worker with SIGKILL and raises :class:`HandlerTimeout`; a
worker that dies (a crash, the OOM killer) raises :class:`WorkerCrashed`. The limit counts from
the moment the worker has imported the handler, so a fresh worker's cold start is not billed to
the first message it runs. Both are retryable
failures, and a fresh worker takes the dead one's place.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import multiprocessing
import traceback
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

from pipeline.errors import PipelineError

log = logging.getLogger(__name__)
_IMPORT_LIMIT_S = 120.0
"""How long a worker may take to import a handler's module before its time limit starts."""


class HandlerTimeout(PipelineError):
    """A CPU-bound handler ran past its time limit and its worker was killed (retryable)."""


class WorkerCrashed(PipelineError):
    """A CPU-bound handler's worker process died while running it (retryable)."""


def function_ref(fn: Any) -> str:
    """``module:qualname`` of a module-level function, importable in a worker."""
    if "<locals>" in fn.__qualname__ or fn.__module__ == "__main__":
        raise ValueError(
            f"CPU-bound handler {fn.__qualname__} must be a module-level function of an "
            "importable module"
        )
    return f"{fn.__module__}:{fn.__qualname__}"


def _resolve(ref: str) -> Any:
    module, _, name = ref.partition(":")
    target: Any = importlib.import_module(module)
    for part in name.split("."):
        target = getattr(target, part)
    return getattr(target, "__wrapped_cpu__", target)


def _serve(conn: Connection) -> None:  # pragma: no cover - runs in the worker process
    """Worker loop: receive (function ref, args), send back (ok, result or exception)."""
    while True:
        try:
            ref, args = conn.recv()
        except EOFError:
            return
        try:
            fn = _resolve(ref)  # importing the handler's module is not part of its time limit
            conn.send((None, None))
            conn.send((True, fn(*args)))
        except Exception as exc:
            try:
                conn.send((False, exc))
            except Exception:
                conn.send((False, RuntimeError(traceback.format_exc(limit=5))))


class _Worker:
    def __init__(self, ctx: Any) -> None:
        parent, child = multiprocessing.Pipe()
        self.conn: Connection = parent
        self.process: BaseProcess = ctx.Process(target=_serve, args=(child,), daemon=True)
        self.process.start()
        child.close()

    def kill(self) -> None:
        with contextlib.suppress(Exception):
            self.process.kill()
            self.process.join(5)
        self.conn.close()


class ProcessPool:
    """``size`` worker processes; each call takes an idle one, or waits for one."""

    def __init__(self, size: int) -> None:
        """Start nothing until the first call."""
        if size < 1:
            raise ValueError(f"pool size must be >= 1, got {size}")
        self._size = size
        self._ctx = multiprocessing.get_context("forkserver")
        self._idle: asyncio.Queue[_Worker] = asyncio.Queue()
        self._all: set[_Worker] = set()
        self._started: asyncio.Future[None] | None = None

    async def _start(self) -> None:
        for _ in range(self._size):
            worker = await asyncio.to_thread(_Worker, self._ctx)
            self._all.add(worker)
            self._idle.put_nowait(worker)

    async def run(self, ref: str, args: tuple[Any, ...], time_limit_s: float) -> Any:
        """Run the function ``ref`` with ``args`` in a worker, within ``time_limit_s``."""
        if self._started is None:  # the first call starts the workers; the others wait for it
            self._started = asyncio.ensure_future(self._start())
        await asyncio.shield(self._started)
        worker = await self._idle.get()
        try:
            worker.conn.send((ref, args))
            limit_s = _IMPORT_LIMIT_S
            ok: bool | None = None
            value: Any = None
            while ok is None:  # first (None, None): it started, and its time limit runs now
                if not await asyncio.to_thread(worker.conn.poll, limit_s):
                    raise HandlerTimeout(  # noqa: TRY301 - the except below replaces the worker
                        f"{ref} ran past its {time_limit_s}s limit; worker killed"
                    )
                ok, value = worker.conn.recv()
                limit_s = time_limit_s
        except HandlerTimeout:
            worker = await self._replace(worker)
            raise
        except (EOFError, OSError) as exc:
            worker = await self._replace(worker)
            raise WorkerCrashed(f"the worker running {ref} died") from exc
        finally:
            self._idle.put_nowait(worker)
        if not ok:
            raise value
        return value

    async def _replace(self, worker: _Worker) -> _Worker:
        worker.kill()
        self._all.discard(worker)
        fresh = await asyncio.to_thread(_Worker, self._ctx)
        self._all.add(fresh)
        return fresh

    async def close(self) -> None:
        """Kill every worker."""
        for worker in list(self._all):
            await asyncio.to_thread(worker.kill)
        self._all.clear()
        self._idle = asyncio.Queue()
        self._started = None
