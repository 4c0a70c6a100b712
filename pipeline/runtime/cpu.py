"""A kill-able process pool for CPU-bound handlers, so the event loop stays free.

A CPU-bound handler is a plain (``def``) module-level function registered with
``@app.handler("lane", cpu=True, time_limit_s=30)``. It runs in one of ``size`` worker processes
started with ``forkserver`` (never forked from the member, whose client libraries run threads).
A call past its time limit kills its worker with SIGKILL and raises :class:`HandlerTimeout`; a
worker that dies (a crash, the OOM killer) raises :class:`WorkerCrashed`; one found gone before
the handler began (it died idle) is replaced and the call goes to the fresh worker instead. The
limit counts from the moment the worker has imported the handler, so a fresh worker's cold start
is not billed to the first message it runs. Both are retryable failures, and a fresh worker takes
the dead one's place.

While a handler runs, a thread of its worker sends a heartbeat every :data:`RUN_BEAT_EVERY_S` (a
quarter of the lane's ``heartbeat_timeout``, at most :data:`BEAT_EVERY_S`) until the handler calls
``ctx.heartbeat()`` (from then on only its own calls send one); the member counts each as a
heartbeat of the run, so a worker that froze or was stopped falls silent
(:mod:`pipeline.runtime.longwork`). Until the handler begins (the pool starting, every worker busy,
the worker importing the handler) the member beats for the run as often.

Each worker leads its own process group: a cancelled call sends the group SIGTERM (in the worker
it turns ``ctx.cancelled`` true, and the worker exits once the handler returns), then SIGKILL
after the pool's grace period, so processes the handler started go with it. A worker whose
member is gone (killed, or leaving without a stop) kills itself and its group, idle or busy.

:meth:`ProcessPool.close` kills every worker; a stop, a replacement or a start still going then
starts no worker into the closed pool (one already starting is killed once started, and
``close`` waits for it), and a replacement that failed to start is not tried again.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import multiprocessing
import os
import pickle
import select
import signal
import threading
import traceback
from collections.abc import Coroutine
from contextvars import ContextVar
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

from pipeline.cancel_tasks import cancel_until_done
from pipeline.errors import PipelineError
from pipeline.log_repeats import error_text
from pipeline.retry.router import carry_digest, frames_digest
from pipeline.runtime import liveness
from pipeline.runtime.failure_log import drop_worker_notes, worker_note

log = logging.getLogger(__name__)
_IMPORT_LIMIT_S = 120.0
"""How long a worker may take to import a handler's module before its time limit starts."""
BEAT_EVERY_S = 1.0
"""How often, at most, a worker running a handler sends a heartbeat on its own."""
_MIN_BEAT_EVERY_S = 0.005
"""A quarter of the shortest heartbeat timeout a member accepts (two of its shortest ticks)."""
RUN_BEAT_EVERY_S: ContextVar[float] = ContextVar("pipeline_cpu_beat_every_s", default=BEAT_EVERY_S)
"""How often the current run beats while it waits for its worker and while its handler runs
(set by :mod:`pipeline.runtime.longwork` from the lane's ``heartbeat_timeout``)."""
_BEAT = "beat"
_RESPAWN_FIRST_S = 0.1
_RESPAWN_LAST_S = 5.0
"""A replacement worker that failed to start is tried again after 0.1 s, doubling to 5 s."""


class HandlerTimeout(PipelineError):
    """A CPU-bound handler ran past its time limit and its worker was killed (retryable)."""


class WorkerCrashed(PipelineError):
    """A CPU-bound handler's worker process died while running it (retryable)."""


def beat_every_s(heartbeat_timeout_ms: int) -> float:
    """How often a run of a lane with ``heartbeat_timeout_ms`` beats: 4 times a timeout or more."""
    return min(BEAT_EVERY_S, max(_MIN_BEAT_EVERY_S, heartbeat_timeout_ms / 4000))


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


class _Beats:  # pragma: no cover - runs in the worker process
    """A worker's heartbeats: a thread's while a handler runs, until it sends its own."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self._lock = threading.Lock()
        self.running = threading.Event()
        self.manual = threading.Event()
        self._wake = threading.Event()
        self._every_s = BEAT_EVERY_S
        liveness.worker_beat = self.handler_beat
        threading.Thread(target=self._forever, daemon=True).start()

    def send(self, item: tuple[Any, Any]) -> None:
        with self._lock:
            self._conn.send(item)

    def beat(self) -> None:
        if self.running.is_set():
            with contextlib.suppress(OSError, ValueError):
                self.send((_BEAT, None))

    def handler_beat(self) -> None:
        self.manual.set()
        self.beat()

    def start(self, every_s: float) -> None:
        """A handler begins: beat now, then every ``every_s`` until it beats on its own."""
        self._every_s = every_s
        self.manual.clear()
        self.running.set()
        self._wake.set()  # not after the rest of a wait at the last call's pace

    def _forever(self) -> None:
        while True:
            self.running.wait()
            if not self.manual.is_set():
                self.beat()
            self._wake.wait(self._every_s)
            self._wake.clear()


def _die_with_member(conn: Connection) -> None:  # pragma: no cover - runs in the worker
    """Kill the worker and its process group once the member's end of ``conn`` is closed.

    The worker is a child of the forkserver, not of the member, and holds the forkserver alive
    itself, so nothing else ends it: a handler that never returns (or one the member was killed
    in the middle of, by kill -9 or the OOM killer) would go on, with what it started, for as
    long as it runs. Every way the member leaves closes its end (a stop SIGKILLs first).
    """
    poller = select.poll()
    poller.register(conn.fileno(), select.POLLRDHUP)  # the peer closed; not its messages
    while True:
        try:
            events = [mask for _, mask in poller.poll()]
        except InterruptedError:
            continue
        if any(mask & select.POLLNVAL for mask in events):
            return  # the worker closed its own end: it is exiting
        if events:
            break
    with contextlib.suppress(OSError):
        if os.getpgid(0) == os.getpid():  # the worker leads its group: the handler's children
            os.killpg(0, signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)


def _serve(conn: Connection) -> None:  # pragma: no cover - runs in the worker process
    """Worker loop: receive (function ref, args, beat every s), send back the outcome.

    The outcome is ``(True, None)``, or ``(False, (exception, digest))``: the digest
    (:func:`~pipeline.retry.router.frames_digest`) of the frames the exception was raised
    through here, which pickle does not carry. Between the start mark ``(None, None)`` and the
    outcome it sends ``("beat", None)`` heartbeats (:class:`_Beats`). Once the member's end of
    ``conn`` closes, the worker and its process group are killed, busy or not
    (:func:`_die_with_member`).
    """
    with contextlib.suppress(OSError):
        os.setsid()  # its own process group: a cancellation stops the handler's children too
    threading.Thread(target=_die_with_member, args=(conn,), daemon=True).start()
    beats = _Beats(conn)
    terminated = threading.Event()
    # SIGTERM is the cancellation: ctx.cancelled turns true and the handler may return; the
    # worker then exits. A handler that does not look is killed after the grace period.
    signal.signal(signal.SIGTERM, lambda _signum, _frame: terminated.set())
    liveness.worker_cancelled = terminated.is_set
    while True:
        try:
            ref, args, every_s = conn.recv()
        except EOFError:
            return
        try:
            fn = _resolve(ref)  # importing the handler's module is not part of its time limit
            beats.send((None, None))
            beats.start(every_s)
            try:
                fn(*args)  # its result is not used, so one pickle cannot copy fails nothing
            finally:
                beats.running.clear()
                if terminated.is_set():
                    os._exit(0)  # cancelled: nobody waits for the result
            beats.send((True, None))
        except Exception as exc:
            digest = frames_digest(exc)  # here, where its frames are: its copy comes without
            sent = _portable(exc)
            try:
                beats.send((False, (_with_traceback(sent, exc), digest)))
            except Exception:
                beats.send((False, (RuntimeError(traceback.format_exc(limit=5)), digest)))
            finally:
                with contextlib.suppress(Exception):  # the app's object left as it was raised
                    drop_worker_notes(sent)
                with contextlib.suppress(Exception):  # a worker serving on, whatever it kept
                    _forget(exc)
                del exc, sent


_CHAIN_CLEARED = 1000
"""The most exceptions of a failure's chain and groups whose tracebacks a worker drops."""


def _forget(error: BaseException) -> None:  # pragma: no cover - runs in the worker process
    """Drop what ``error`` keeps of the failure just sent back, as the next raise would not.

    An instance raised again and again (a module-level one of the app's or of a library, as
    the failure itself, its cause or context, or in an exception group) gains frames at each
    raise, and keeps them and their locals for the worker's life, to show them all in its
    next note: every traceback of the chain and groups is dropped (at most
    :data:`_CHAIN_CLEARED` exceptions, each once). A raise outside an ``except`` leaves
    ``__context__`` as it was: ``error``'s own chain is dropped too, or its next note would
    print an earlier failure's exception and event.
    """
    seen: set[int] = set()
    waiting = [error]
    while waiting and len(seen) < _CHAIN_CLEARED:
        current = waiting.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        with contextlib.suppress(Exception):  # an app's exception may refuse the attribute
            current.__traceback__ = None
        linked: list[BaseException | None] = [current.__cause__, current.__context__]
        if isinstance(current, BaseExceptionGroup):
            linked += current.exceptions
        waiting += [e for e in linked if e is not None and id(e) not in seen]
    with contextlib.suppress(Exception):
        error.__cause__ = None
        error.__context__ = None
        error.__suppress_context__ = False


def _with_traceback(sent: Exception, raised: Exception) -> Exception:  # pragma: no cover
    """``sent`` with ``raised``'s traceback as a note (bounded), which pickle carries.

    Pickle drops an exception's traceback, so the member's failure line showed only its own
    frames (handling.py, cpu.py) and every failure of a CPU lane was raised in ``run``; the
    note gives the handler's frames and where it raised (:func:`~.failure_log.worker_note`).
    ``sent`` may be the app's own object, raised again and again (a module-level instance): a
    worker note already on it is replaced, and :func:`_serve` takes this one off once sent.
    """
    with contextlib.suppress(Exception):  # no note rather than no failure
        note = worker_note(raised)
        drop_worker_notes(sent)
        sent.add_note(note)
    return sent


def _portable(exc: Exception) -> Exception:  # pragma: no cover - runs in the worker process
    """``exc`` if pickle can carry it to the member, else a stand-in of its nearest base that can.

    An error pickle cannot copy (it holds a lock, a socket), or cannot rebuild (its constructor
    takes other arguments than its ``args``), would reach the member as a pickling error: a
    fatal error retried, the handler's message lost. The stand-in keeps both: its class is a
    base of the original's (``DeadLetter``, ``Retry``, ``Exception``) and its message starts with
    the original class's name.
    """
    with contextlib.suppress(Exception):
        pickle.loads(pickle.dumps(exc))  # noqa: S301 - our own bytes, just made
        return exc
    message = f"{type(exc).__qualname__}: {error_text(exc)}"
    for base in type(exc).__mro__[1:]:
        with contextlib.suppress(Exception):
            stand_in = base(message)
            pickle.loads(pickle.dumps(stand_in))  # noqa: S301 - our own bytes, just made
            return stand_in  # type: ignore[no-any-return]
    return RuntimeError(message)


def _sent_back(failure: tuple[Exception, str]) -> Exception:
    """A worker's failure, (exception, digest), as the exception to raise in the member.

    Its ``pl-error-digest`` is the worker's: the frames it is raised through here are the
    member's only (this module's, the runtime's), the same for every failure of the lane, so
    the digest the worker took of its own frames goes on the exception
    (:func:`~pipeline.retry.router.carry_digest`).
    """
    error, digest = failure
    carry_digest(error, digest)
    return error


class _Worker:
    def __init__(self, ctx: Any) -> None:
        parent, child = multiprocessing.Pipe()
        self.conn: Connection = parent
        self.process: BaseProcess = ctx.Process(target=_serve, args=(child,), daemon=True)
        self.process.start()
        child.close()

    def signal_group(self, sig: int) -> None:
        """Send ``sig`` to the worker and every process it started (its process group)."""
        pid = self.process.pid
        if pid is None:
            return
        with contextlib.suppress(OSError):  # the group: the processes the handler started
            os.killpg(pid, sig)
        with contextlib.suppress(OSError):  # the worker itself, whatever its group
            os.kill(pid, sig)

    def kill(self) -> None:
        with contextlib.suppress(Exception):
            self.signal_group(signal.SIGKILL)
            self.process.join(5)
        self.conn.close()


async def _readable(conn: Connection, timeout_s: float) -> bool:
    """Wait (without a thread, so a cancellation is immediate) until ``conn`` has data.

    Not under ``asyncio.wait_for``: on Python 3.11 it drops a cancellation that lands once the
    data has come (CPython issue 86296), and the stop of a run whose worker had just beaten was
    lost (its worker never got SIGTERM).
    """
    if conn.poll(0):
        return True
    loop = asyncio.get_running_loop()
    ready: asyncio.Future[bool] = loop.create_future()
    fd = conn.fileno()

    def wake() -> None:
        if not ready.done():
            ready.set_result(True)

    def expire() -> None:
        if not ready.done():
            ready.set_result(False)

    loop.add_reader(fd, wake)
    timer = loop.call_later(max(timeout_s, 0.0), expire)
    try:
        return await ready
    finally:
        timer.cancel()
        loop.remove_reader(fd)


class _Unstarted(Exception):
    """The worker was gone before the handler began: the call may go to a fresh worker."""


async def _call(
    worker: _Worker, ref: str, args: tuple[Any, ...], time_limit_s: float, every_s: float
) -> tuple[bool, Any]:
    """Send the call to ``worker`` and wait for its outcome (:func:`_outcome`)."""
    try:
        worker.conn.send((ref, args, every_s))
    except OSError as exc:  # a broken pipe: the worker is gone
        raise _Unstarted(ref) from exc
    return await _outcome(worker.conn, ref, time_limit_s, every_s)


async def _outcome(
    conn: Connection, ref: str, time_limit_s: float, every_s: float
) -> tuple[bool, Any]:
    """Wait for a worker's outcome (see :func:`_serve`), counting its heartbeats on the way.

    Until the worker's start mark the run beats every ``every_s`` on the worker's behalf.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + _IMPORT_LIMIT_S
    started = False
    while True:  # (None, None): it started, and its time limit runs from now
        left_s = deadline - loop.time()
        if not started and left_s > 0:
            # A worker still starting or importing the handler is not the handler's silence:
            # the run beats on its behalf until the handler starts.
            liveness.automatic()
            left_s = min(left_s, every_s)
        if not await _readable(conn, left_s):
            if loop.time() < deadline:
                continue
            raise _overran(ref, time_limit_s, started=started)
        try:
            ok, value = conn.recv()
        except (EOFError, OSError) as exc:
            if started:
                raise
            raise _Unstarted(ref) from exc
        if ok is None:
            started = True
            deadline = loop.time() + time_limit_s
        elif ok == _BEAT:
            current = liveness.CURRENT.get()
            if current is not None:
                current.beat()  # the worker sends only the beats that count
        else:
            return bool(ok), value


def _overran(ref: str, time_limit_s: float, *, started: bool) -> HandlerTimeout:
    """The error of a call whose worker is killed: past its time limit, or its module's import."""
    if started:
        return HandlerTimeout(f"{ref} ran past its {time_limit_s}s limit; worker killed")
    return HandlerTimeout(
        f"{ref} never began: importing its module took over {_IMPORT_LIMIT_S:g}s"
        " (move slow work out of import time); worker killed"
    )


class ProcessPool:
    """``size`` worker processes; each call takes an idle one, or waits for one."""

    def __init__(self, size: int, *, grace_s: float = 5.0) -> None:
        """Start nothing until the first call.

        A cancelled call's worker gets ``grace_s`` between SIGTERM and SIGKILL.
        """
        if size < 1:
            raise ValueError(f"pool size must be >= 1, got {size}")
        self._size = size
        self._grace_s = grace_s
        self._ctx = multiprocessing.get_context("forkserver")
        self._idle: asyncio.Queue[_Worker] = asyncio.Queue()
        self._all: set[_Worker] = set()
        self._started: asyncio.Future[None] | None = None
        self._unstarted = size
        """Workers the start has still to start."""
        self._generation = 0
        """Bumped by :meth:`close`: work begun before it puts no worker into the pool."""
        self._tasks: set[asyncio.Task[None]] = set()
        """Stops and replacements of workers, and starts tried again after a failure."""
        self._spawning: set[asyncio.Task[bool]] = set()
        """Workers being started (:meth:`_spawn`), which :meth:`close` waits for."""

    async def _start(self) -> None:
        generation = self._generation
        try:
            while self._unstarted > 0:
                if not await self._spawn(generation) or generation != self._generation:
                    return  # closed meanwhile: close() reset what is left to start
                self._unstarted -= 1
        except BaseException:
            if generation == self._generation:
                self._started = None  # a spawn failed (fork's EAGAIN): the next starts the rest
            raise

    async def run(self, ref: str, args: tuple[Any, ...], time_limit_s: float) -> None:
        """Run the function ``ref`` with ``args`` in a worker, within ``time_limit_s``.

        What it returns is dropped in the worker (a handler's result is not used); what it
        raises is raised here, as itself or, when pickle cannot carry it, as a stand-in of its
        nearest base class that pickle can (its message names the original class), with the
        ``pl-error-digest`` of where it was raised in the worker (:func:`_sent_back`).
        Cancelling the call stops its worker (SIGTERM, SIGKILL after the grace period) and
        puts a fresh one in its place.
        """
        every_s = RUN_BEAT_EVERY_S.get()
        generation = self._generation
        taken = await self._idle_worker(every_s)
        worker: _Worker | None = taken  # None once it is no longer this call's to give back
        try:
            try:
                ok, value = await _call(taken, ref, args, time_limit_s, every_s)
            except _Unstarted:  # it died idle (the OOM killer): not this call's doing
                worker = None
                await self._swap(taken)
                if generation != self._generation:  # not into a pool started after close()
                    raise WorkerCrashed(f"the pool closed before {ref} began") from None
                taken = worker = await self._idle_worker(every_s)
                ok, value = await _call(taken, ref, args, time_limit_s, every_s)
        except HandlerTimeout:
            dead, worker = worker, None
            await self._swap(dead)
            raise
        except asyncio.CancelledError:
            if worker is not None:  # else: cancelled while a swap or the wait for a worker ran
                stopping = self._background(self._stop(worker))
                worker = None  # the stop puts its fresh worker in the idle queue itself
                await asyncio.shield(stopping)  # cancelled again: the stop goes on regardless
            raise
        except (_Unstarted, EOFError, OSError) as exc:
            dead, worker = worker, None
            await self._swap(dead)
            raise WorkerCrashed(f"the worker running {ref} died") from exc
        finally:
            if worker is not None:
                self._give_back(worker)
        if not ok:
            raise _sent_back(value)

    async def _idle_worker(self, every_s: float) -> _Worker:
        """An idle worker once there is one; meanwhile the current run beats every ``every_s``.

        Waiting for the pool to start or for a busy worker is not the handler's silence.
        """
        if self._started is None:  # the first call starts the workers; the others wait for it
            self._started = asyncio.ensure_future(self._start())
        taking = asyncio.ensure_future(self._take(self._started))
        try:
            while not taking.done():
                liveness.automatic()
                await asyncio.wait({taking}, timeout=every_s)
        except asyncio.CancelledError:
            if taking.done() and not taking.cancelled() and taking.exception() is None:
                self._give_back(taking.result())  # taken as the call was cancelled
            taking.cancel()
            raise
        return taking.result()

    async def _take(self, started: asyncio.Future[None]) -> _Worker:
        await asyncio.shield(started)
        return await self._idle.get()

    def _give_back(self, worker: _Worker) -> None:
        """Put ``worker`` back in the idle queue, unless :meth:`close` killed it."""
        if worker in self._all:
            self._idle.put_nowait(worker)

    def _background(self, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """Run ``work`` as a task that :meth:`close` cancels."""
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _stop(self, worker: _Worker) -> None:
        """SIGTERM the worker's group, SIGKILL it after the grace period, then replace it."""
        if worker not in self._all:
            return  # close() killed it, and the pool it belonged to
        worker.signal_group(signal.SIGTERM)
        await asyncio.to_thread(worker.process.join, self._grace_s)
        await self._replace(worker)

    async def _swap(self, worker: _Worker | None) -> None:
        """:meth:`_replace` ``worker``, to the end even if the call waiting for it is cancelled."""
        if worker is not None:
            replacing = self._background(self._replace(worker))
            await asyncio.wait({replacing})  # cancelled: the replacement goes on regardless
            if not replacing.cancelled():  # else close() stopped it
                replacing.result()

    async def _replace(self, worker: _Worker) -> None:
        """Kill ``worker`` and put a fresh one in the idle queue in its place.

        One that fails to start (fork's EAGAIN or ENOMEM, under the pressure that may have
        killed the last) is started again in the background until one does: a slot lost there
        left the pool a worker short for good, and with none left every call waited for ever.
        After :meth:`close` nothing is started: its pool is gone.
        """
        if worker not in self._all:
            return  # close() killed it
        generation = self._generation
        self._all.discard(worker)
        await asyncio.to_thread(worker.kill)  # its join must not hold the loop (a D-state exit)
        if generation != self._generation:
            return
        try:
            await self._spawn(generation)
        except Exception:
            if generation != self._generation:
                return
            log.warning("cpu pool: a worker failed to start; starting it again", exc_info=True)
            self._background(self._respawn(generation))

    async def _respawn(self, generation: int) -> None:
        """Start a worker into the idle queue; after a failure again (0.1 s, doubling to 5 s)."""
        delay_s = _RESPAWN_FIRST_S
        while generation == self._generation:
            await asyncio.sleep(delay_s)
            if generation != self._generation:
                return
            try:
                await self._spawn(generation)
            except Exception as exc:
                log.debug("cpu pool: a worker failed to start again: %s", exc)
                delay_s = min(delay_s * 2, _RESPAWN_LAST_S)
                continue
            return

    async def _spawn(self, generation: int) -> bool:
        """Start a worker into the idle queue of the pool of ``generation``; False if closed.

        The start goes on when the caller is cancelled (by :meth:`close`, which waits for it):
        a worker it starts after the pool was closed is killed, never left running.
        """
        spawning = asyncio.ensure_future(self._spawn_into(generation))
        self._spawning.add(spawning)
        spawning.add_done_callback(self._spawned)
        return await asyncio.shield(spawning)

    def _spawned(self, spawning: asyncio.Task[bool]) -> None:
        self._spawning.discard(spawning)
        if not spawning.cancelled():
            spawning.exception()  # retrieved: its caller, cancelled, may not be there to read it

    async def _spawn_into(self, generation: int) -> bool:
        fresh = await asyncio.to_thread(_Worker, self._ctx)
        if generation != self._generation:
            await asyncio.to_thread(fresh.kill)
            return False
        self._all.add(fresh)
        self._idle.put_nowait(fresh)
        return True

    async def close(self) -> None:
        """Kill every worker, and start none in their place.

        Stops and replacements still going are cancelled; a worker they or the pool's start
        were starting is killed once started, and waited for. A later call starts a new pool.
        """
        self._generation += 1
        workers = list(self._all)
        self._all.clear()  # a stop, a replacement or a call finding its worker gone: close's
        self._idle = asyncio.Queue()
        starting, self._started = self._started, None
        self._unstarted = self._size
        await cancel_until_done(*self._tasks)
        for worker in workers:
            await asyncio.to_thread(worker.kill)
        going: set[asyncio.Future[Any]] = set(self._spawning)
        if starting is not None:
            going.add(starting)
        if going:
            await asyncio.wait(going)
