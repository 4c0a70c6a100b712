"""Blocking librdkafka calls run on threads of their own that never hold the process's exit.

A call such as ``list_topics`` or ``committed`` waits up to the request timeout for a broker
that does not answer. Run on the event loop's default executor, a call given up on (a metrics
refresh past its own timeout, a send cut short by a stop) kept its thread busy, and the loop's
close, then the interpreter's exit, waited for that thread: ``pipeline ingress serve`` stopped
with its broker silent printed its last line and lived on until the request timed out. Each
call here runs on a daemon thread instead; its caller still waits for it, and nothing else does.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

__all__ = ["detached"]


async def detached(fn: Callable[..., T], *args: object) -> T:
    """``fn(*args)`` on a daemon thread of its own, awaited like :func:`asyncio.to_thread`."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()
    context = contextvars.copy_context()

    def deliver(outcome: Callable[[], object]) -> None:
        def hand_over() -> None:
            if not future.done():  # done: the caller gave up on the call
                outcome()

        with contextlib.suppress(RuntimeError):  # a loop closed meanwhile: nobody waits
            loop.call_soon_threadsafe(hand_over)

    def run() -> None:
        try:
            result = context.run(fn, *args)
        except BaseException as exc:  # handed to the caller, whatever it is
            deliver(functools.partial(future.set_exception, exc))
        else:
            deliver(functools.partial(future.set_result, result))

    name = f"kafka-{getattr(fn, '__name__', 'call')}"
    threading.Thread(target=run, name=name, daemon=True).start()
    return await future
