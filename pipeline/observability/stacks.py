"""``kill -USR1 <pid>``: what every thread and every asyncio task of a running process is doing.

For a member that does not stop, a lane that makes no progress or an ingress that stopped
answering: the process writes to its standard error each thread's Python stack
(:mod:`faulthandler`), then each task of its event loop, by name, with the chain of coroutines
it is suspended in down to the future it waits for. Nothing else changes: the process goes on.
``pipeline consume`` and ``pipeline ingress serve`` install it (:func:`install`).
"""

from __future__ import annotations

import asyncio
import faulthandler
import io
import os
import signal
import sys
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
    """Write every thread's stack and every task of the running loop to ``out`` (stderr)."""
    out = out if out is not None else sys.stderr
    out.write(f"--- stacks of process {os.getpid()}: threads ---\n")
    out.flush()
    try:
        faulthandler.dump_traceback(file=out, all_threads=True)
    except (AttributeError, ValueError, io.UnsupportedOperation):  # no file descriptor behind it
        out.write("(thread stacks need a stream with a file descriptor)\n")
    tasks = sorted(asyncio.all_tasks(), key=lambda task: task.get_name())
    out.write(f"--- {len(tasks)} asyncio tasks ---\n")
    for task in tasks:
        state = " (cancelling)" if task.cancelling() else ""
        out.write(f"task {task.get_name()}{state}:\n")
        out.writelines(f"  {line}\n" for line in awaiting(task.get_coro()))
        waiter = getattr(task, "_fut_waiter", None)  # what the task is suspended on, if anything
        if waiter is not None:
            out.write(f"  waits on {waiter!r}\n")
    out.write("--- end of stacks ---\n")
    out.flush()


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
