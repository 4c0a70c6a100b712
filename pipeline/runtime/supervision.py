"""Background tasks a member cannot run without: the first to fail stops the member.

A task started with ``asyncio.create_task`` that raises ends without a word: its exception stays
on the task, seen at best when the process stops. A member whose commit loop, debounced-lane
runner or long-work tick had ended that way went on polling and running handlers, healthy by
every probe, while nothing was committed, no turn ran or no heartbeat was sent.

:class:`Essential` starts such tasks and watches them. The first one that ends while the member
runs (with an exception, or returning when it should not) is logged at once with its traceback
and sets :attr:`Essential.failed`; the member then shuts down as on SIGTERM, and
:meth:`Essential.check` raises one :class:`~pipeline.errors.PipelineError` line naming the task,
so ``pipeline consume`` exits non-zero and its supervisor (Kubernetes) starts it again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

from pipeline.errors import PipelineError

__all__ = ["Essential"]

log = logging.getLogger(__name__)


class Essential:
    """The essential background tasks of ``owner`` (a member of a group)."""

    def __init__(self, owner: str) -> None:
        """Watch tasks of ``owner``, named in the log line and the error."""
        self._owner = owner
        self._closing = False
        self._failure: tuple[str, BaseException | None] | None = None
        self.failed = asyncio.Event()
        """Set when an essential task ended while the owner still ran."""

    def start(self, coro: Coroutine[Any, Any, None], what: str) -> asyncio.Task[None]:
        """Run ``coro`` as a task that must not end before :meth:`closing` (``what`` names it)."""
        task = asyncio.create_task(coro, name=f"{self._owner}: {what}")
        task.add_done_callback(lambda done: self._ended(done, what))
        return task

    def closing(self) -> None:
        """The owner stops: its tasks may end from now on."""
        self._closing = True

    def check(self) -> None:
        """Raise for the essential task that failed, if one did.

        Raises:
            PipelineError: one line naming the owner, the task and its error.
        """
        if self._failure is None:
            return
        what, exc = self._failure
        reason = "it ended" if exc is None else f"{type(exc).__name__}: {exc}"
        raise PipelineError(
            f"{self._owner}: its {what} failed ({reason}), so it stopped; the traceback is"
            " logged above. Start it again (its uncommitted messages are delivered again) and"
            " report the traceback if it recurs"
        ) from exc

    def _ended(self, task: asyncio.Task[None], what: str) -> None:
        if task.cancelled():
            return
        exc = task.exception()  # retrieved here, so never reported as "never retrieved"
        if self._closing or self._failure is not None:
            if exc is not None:
                log.error("%s: its %s failed while stopping", self._owner, what, exc_info=exc)
            return
        self._failure = (what, exc)
        if exc is None:
            log.error("%s: its %s ended while running; stopping", self._owner, what)
        else:
            log.error("%s: its %s failed; stopping", self._owner, what, exc_info=exc)
        self.failed.set()
