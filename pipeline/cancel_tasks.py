"""Cancelling asyncio tasks though a cancellation can be lost below them (Python 3.11).

On Python 3.11 ``asyncio.wait_for`` returns the awaited result instead of raising when a
cancellation lands in the turn of the loop that result arrives in (CPython issue 86296, fixed in
3.12). redis-py writes every command under it (its ``socket_timeout``), and psycopg's pool waits
for a connection under it, so a task cancelled once may go on: a handler returns, a loop takes
its next turn. Two guards, one for each side of the task:

- :func:`cancel_until_done`, for whoever stops a task and waits for it (a shutdown): the task
  is cancelled again until it has ended, so a lost cancellation costs ``recancel_s``, not a
  wait without end.
- :func:`raise_absorbed_cancel`, for code inside the task: a cancellation requested during its
  block is raised at the block's end, even if something below swallowed it.

Not to be confused with :mod:`pipeline.cancel`, the operators' cancellation of messages.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from types import TracebackType
from typing import Any

log = logging.getLogger(__name__)

RECANCEL_S = 0.5
"""How long :func:`cancel_until_done` waits for cancelled tasks before cancelling them again."""


async def cancel_until_done(
    *tasks: asyncio.Task[Any], recancel_s: float = RECANCEL_S, report: bool = True
) -> None:
    """Cancel ``tasks`` and wait until every one has ended, cancelling again those still going.

    What they ended with is not raised, so one task's error does not cut the rest of a stop
    short: with ``report`` an error (other than the cancellation) is logged, one line each with
    its traceback; without, it is left in the task for the caller to read (``task.result()``).
    A task that had ended already is left alone. A task that ignores every cancellation is
    still waited for, as ``await task`` would.

    Args:
        tasks: the tasks to stop.
        recancel_s: seconds to wait after each cancellation before cancelling again.
        report: log the errors the tasks ended with.
    """
    going = {task for task in tasks if not task.done()}
    stopped = list(going)
    while going:
        for task in going:
            task.cancel()
        _, going = await asyncio.wait(going, timeout=recancel_s)
    if not report:
        return
    for task in stopped:
        error = None if task.cancelled() else task.exception()
        if error is not None:
            log.error(
                "%s ended with an error as it was stopped: %r",
                task.get_name(),
                error,
                exc_info=error,
            )


class _RaiseAbsorbed(contextlib.AbstractContextManager[None]):
    """See :func:`raise_absorbed_cancel`."""

    _task: asyncio.Task[Any] | None = None
    _asked = 0

    def __enter__(self) -> None:
        self._task = task = asyncio.current_task()
        self._asked = 0 if task is None else task.cancelling()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        task = self._task
        if exc_type is None and task is not None and task.cancelling() > self._asked:
            raise asyncio.CancelledError


def raise_absorbed_cancel() -> contextlib.AbstractContextManager[None]:
    """A block that raises :class:`asyncio.CancelledError` if its task was cancelled during it.

    For a block that ends normally although its task was asked to cancel meanwhile (something
    below it absorbed the request: ``asyncio.wait_for`` on Python 3.11). A block that raises
    keeps its own exception.
    """
    return _RaiseAbsorbed()
