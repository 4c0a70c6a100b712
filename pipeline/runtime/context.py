"""What a handler knows about the message it is handling."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

from pipeline import headers as h
from pipeline.envelope import Message
from pipeline.errors import ConfigError
from pipeline.retry.guard_store import message_id
from pipeline.runtime import liveness
from pipeline.runtime.idempotency import IdempotencyGuard

T = TypeVar("T")


def event_name(message: Message) -> str:
    """What ``ctx.once`` knows ``message``'s event by: its event id, else its first delivery."""
    raw = message.headers.get(h.EVENT_ID)
    return raw.decode(errors="replace") if raw else message_id(message)


@dataclass(frozen=True, slots=True)
class Context:
    """The second argument of every handler.

    Attributes:
        message: the raw message (topic, partition, offset, key, value, headers).
        lane: the lane the handler serves.
        attempt: 1 for the first processing attempt, 2 for the first retry, and so on.
    """

    message: Message
    lane: str
    attempt: int
    guard: IdempotencyGuard | None = field(default=None, repr=False)
    once_event: str | None = field(default=None, repr=False)
    """The name ``ctx.once`` records effects under; None: the message's (:func:`event_name`).

    A debounced turn's names all its messages (:func:`pipeline.runtime.turns.turn_event`)."""
    once_also: str | None = field(default=None, repr=False)
    """A name an earlier release recorded the same effects under, whose done record counts."""

    @property
    def key(self) -> str | None:
        """The message key as text (the conversation, document or other ordering key)."""
        return self.message.key.decode(errors="replace") if self.message.key else None

    @property
    def tenant(self) -> str | None:
        """The tenant header, if the producer set one."""
        raw = self.message.headers.get(h.TENANT)
        return raw.decode(errors="replace") if raw else None

    @property
    def event_id(self) -> str | None:
        """The provider's event id header, if the producer set one.

        A redriven copy of an event that had none carries its first delivery's
        ``topic:partition:offset`` here (what ``ctx.once`` knew it by), where the first run saw
        None.
        """
        raw = self.message.headers.get(h.EVENT_ID)
        return raw.decode(errors="replace") if raw else None

    def heartbeat(self) -> None:
        """Tell the runtime the handler is making progress (long work; see ``heartbeat_timeout``).

        Until the first call the runtime beats on its own while the handler's event loop or
        worker process is alive. From the first call on only these calls count: a handler
        silent for longer than its lane's ``heartbeat_timeout`` is hung, stopped and retried.
        """
        liveness.heartbeat()

    @property
    def cancelled(self) -> bool:
        """Whether this run was cancelled (``pipeline cancel``, the reconciler): stop soon.

        An ``async`` handler is also cancelled at its next ``await``. In a ``cpu=True`` handler
        it turns true when its worker gets SIGTERM; the worker is killed (SIGKILL) if the
        handler has not returned after ``runtime.cancel_grace_s``.
        """
        return liveness.cancelled()

    def once(self, name: str, effect: Callable[[], Awaitable[T]]) -> Awaitable[T | None]:
        """Run ``effect`` once per event, across redeliveries and retries (``await`` it).

        :mod:`pipeline.runtime.idempotency` says exactly what is guaranteed. The event is
        identified by its event-id header, else by where it was first delivered.
        Returns the effect's result, or None if an earlier delivery already ran it.

        In a debounced turn the event is the turn: its messages, in order (a retry of the same
        messages skips an effect that ran; a turn holding a message more runs it again).

        Raises:
            ConfigError: at the call, in a ``cpu=True`` handler (its worker process has no
                Redis; a plain ``def`` could not await it anyway), or in a member run without
                a Redis client. Retried like any other error the handler raises.
        """
        if liveness.worker_beat is not None:  # set only in a cpu=True worker process
            raise ConfigError(
                f"ctx.once({name!r}) is not available in cpu=True handlers (lane {self.lane!r}): "
                "call it from an async handler, e.g. split the work into a cpu=True lane and "
                "a lane whose handler makes the side effect"
            )
        if self.guard is None:
            raise ConfigError("ctx.once needs Redis: run the member with a Redis client")
        event = self.once_event or event_name(self.message)
        return self.guard.once(self.lane, event, name, effect, also_done=self.once_also)
