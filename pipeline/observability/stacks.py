"""``kill -USR1 <pid>``: what every thread and every asyncio task of a running process is doing.

For a member that does not stop, a lane that makes no progress or an ingress that stopped
answering: the process writes to its standard error each thread's Python stack
(:mod:`faulthandler`), then each task of its event loop, by name, with the chain of coroutines
it is suspended in down to the future it waits for. Nothing else changes: the process goes on.
``pipeline consume`` and ``pipeline ingress serve`` install it (:func:`install`).

A dump is made whole first and written in one piece, under a POSIX lock on standard error, so
the dumps of processes that share one standard error (the workers of ``pipeline ingress serve
--workers N``, which all get the signal at once) follow one another instead of mixing.
"""

from __future__ import annotations

import asyncio
import contextlib
import faulthandler
import fcntl
import io
import os
import signal
import sys
import tempfile
from collections.abc import Iterator
from types import FrameType
from typing import Any, TextIO

SIGNAL = signal.SIGUSR1


def install(loop: asyncio.AbstractEventLoop) -> None:
    """Dump the stacks to standard error whenever the process gets SIGUSR1."""
    loop.add_signal_handler(SIGNAL, dump)


def remove(loop: asyncio.AbstractEventLoop) -> None:
    """Stop answering SIGUSR1 (its default action again: the process ends)."""
    loop.remove_signal_handler(SIGNAL)


def dump(out: TextIO | None = None) -> None:
    """Write every thread's stack and every task of the running loop to ``out`` (stderr), whole."""
    out = out if out is not None else sys.stderr
    _write_whole(out, render())


def render() -> str:
    """The dump :func:`dump` writes: a header, the threads' stacks, the loop's tasks, an end."""
    lines = [f"--- stacks of process {os.getpid()}: threads ---\n", _threads()]
    tasks = sorted(asyncio.all_tasks(), key=lambda task: task.get_name())
    lines.append(f"--- {len(tasks)} asyncio tasks ---\n")
    for task in tasks:
        state = " (cancelling)" if task.cancelling() else ""
        lines.append(f"task {task.get_name()}{state}:\n")
        lines.extend(f"  {line}\n" for line in awaiting(task.get_coro()))
        waiter = getattr(task, "_fut_waiter", None)  # what the task is suspended on, if anything
        if waiter is not None:
            lines.append(f"  waits on {waiter!r}\n")
    lines.append(f"{END}\n")
    return "".join(lines)


END = "--- end of stacks ---"
"""The last line of a dump."""


def _threads() -> str:
    """Every thread's stack, as :mod:`faulthandler` writes it (to a descriptor: a scratch file)."""
    try:
        with tempfile.TemporaryFile() as scratch:
            faulthandler.dump_traceback(file=scratch, all_threads=True)
            scratch.seek(0)
            return scratch.read().decode("utf-8", "backslashreplace")
    except OSError as exc:
        return f"(thread stacks not written: no scratch file: {exc})\n"


def _write_whole(out: TextIO, text: str) -> None:
    """``text`` to ``out`` in one piece: to its descriptor under a POSIX lock, if it has one.

    The lock is per process (``lockf``; ``flock`` would be shared by every process that
    inherited the same open standard error), so another process's dump waits for this one.
    """
    try:
        fd = out.fileno()
    except (AttributeError, ValueError, io.UnsupportedOperation):  # no descriptor behind it
        out.write(text)
        out.flush()
        return
    out.flush()  # whatever it buffered goes first
    data = memoryview(text.encode(getattr(out, "encoding", None) or "utf-8", "backslashreplace"))
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX)
        locked = True
    except OSError:  # a descriptor that takes no lock (or not opened for writing): unlocked
        locked = False
    try:
        while data:
            data = data[os.write(fd, data) :]
    finally:
        if locked:
            with contextlib.suppress(OSError):
                fcntl.lockf(fd, fcntl.LOCK_UN)


def awaiting(coro: Any) -> Iterator[str]:
    """The frames of ``coro`` and of the coroutines it awaits, outermost first."""
    while coro is not None:
        frame = _frame(coro)
        if frame is None:  # a future's iterator, or a coroutine not started or finished
            return
        code = frame.f_code
        yield f'File "{code.co_filename}", line {frame.f_lineno}, in {code.co_name}'
        coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)


def _frame(coro: Any) -> FrameType | None:
    for name in ("cr_frame", "gi_frame", "ag_frame"):
        frame = getattr(coro, name, None)
        if frame is not None:
            return frame  # type: ignore[no-any-return]
    return None
