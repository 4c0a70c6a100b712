"""Debounced lanes in a member: buffer each message, then run one turn per conversation burst.

A message of a debounced lane is decoded (a malformed one is dead-lettered at once), its
conversation key read from the event field the lane's ``debounce.key`` names (a message without
one: its message key, else a conversation of its own, logged once per lane), and it is recorded
in the lane's :class:`~pipeline.admission.debounce.Debouncer`. Once recorded it is durable in
Redis, so its offset may be committed. A :class:`~pipeline.admission.debounce.runner.TurnRunner`
per lane claims due turns and calls the handler with the turn's events in order.

A turn whose handler fails with a retryable error runs again after a backoff, with the same
messages plus any that arrived meanwhile; after the lane's ``retry.max_attempts`` (or at once
for a fatal error) each of its messages is dead-lettered, in order. Redis being unreachable when
a message arrives makes that message a turn of its own, run at once: a conversation may then see
a duplicate turn, never a lost message.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel
from redis.asyncio import Redis

from pipeline import tracing
from pipeline.admission.debounce import Debouncer, Turn
from pipeline.admission.debounce.codec import BufferedMessage
from pipeline.admission.debounce.debouncer import HELD_TTL_MS
from pipeline.admission.debounce.runner import TurnRunner
from pipeline.envelope import Message
from pipeline.errors import PoisonMessage, Skip
from pipeline.offload.reference import OFFLOAD
from pipeline.runtime.app import Lane
from pipeline.runtime.context import Context, event_name
from pipeline.runtime.idempotency import IdempotencyGuard
from pipeline.runtime.payloads import Payloads

log = logging.getLogger(__name__)


def key_value(event: Any, message: Message, field: str) -> str | None:
    """The value of ``field`` in the event (a model attribute or a JSON member), if it has one.

    A model's attribute, a dict event's member, or a member of the JSON the event's bytes or
    text hold (the message's value for any other event).

    None when the event has no such field, or it is null or empty: a body that is no JSON
    object (not JSON, or nested too deep for ``json`` to read) has no such member.
    """
    value: Any = None
    if isinstance(event, BaseModel):
        value = getattr(event, field, None)
    elif isinstance(event, dict):  # a dict lane's event: the body already read as JSON
        value = event.get(field)
    else:
        # The event's own bytes or text where it has them: an offloaded message's value is
        # its reference, the event the payload fetched for it.
        body = event if isinstance(event, bytes | str) else message.value
        try:
            document = json.loads(body)
        except (ValueError, RecursionError):  # RecursionError: nested too deep
            document = None
        if isinstance(document, dict):
            value = document.get(field)
    if value is None or value == "":
        return None
    return str(value)


def own_conversation(message: Message) -> str:
    """The conversation of a message whose event names none: its message key, else its event.

    Messages without either must not share one conversation (a "" key would merge every
    user's messages into one turn): such a message is a conversation of its own, named by its
    event id (so a replayed copy still finds its first), else by where it was first delivered.
    """
    if message.key:
        return message.key.decode(errors="replace")
    return event_name(message)


def to_message(buffered: BufferedMessage) -> Message:
    """The consumed :class:`Message` a buffered one stands for."""
    return Message(
        buffered.topic,
        buffered.partition,
        buffered.offset,
        buffered.key,
        buffered.value,
        dict(buffered.headers),
        buffered.timestamp_ms,
    )


def turn_event(messages: Sequence[Message]) -> str:
    """The name ``ctx.once`` knows a turn by: every message of it, in record order.

    Each message counts by its :func:`~pipeline.runtime.context.event_name` (its event id, else
    its first delivery), so a retry of the same messages, or their redriven copies, is the same
    turn, and a turn holding one message more (recorded during a retry's backoff, or ahead of
    redriven dead letters) is another. A turn of one message is named so too, not by its
    message's event: a release before this one named every turn by its last message, and that
    name is read as such a release's record of the turn (``Context.once_also``); a one-message
    turn's record there would be taken for one of the turn [new, message], whose effect never
    ran for the new message.
    """
    names = [event_name(m) for m in messages]
    digest = hashlib.sha256(json.dumps(names).encode()).hexdigest()[:32]
    return f"turn:{digest}"


@dataclass
class TurnOutcome:
    """What became of a turn's messages (the member counts and routes them)."""

    messages: list[Message]
    outcome: str
    error: Exception | None = None
    lateness_s: float = 0.0
    """How late the turn fired after it was due."""
    duration_s: float | None = None
    """How long its handler ran (decoding included); None when the handler did not run."""
    attempts: int = 1
    """How many runs of these messages started (this one included, if it ran)."""
    first_failure_ms: int | None = None
    """When an earlier run of these messages first failed (Redis clock); None: none did."""


def _left(messages: list[Message], kept: list[Message]) -> list[Message]:
    """The messages of ``messages`` not in ``kept``, in order."""
    ids = {id(m) for m in kept}
    return [m for m in messages if id(m) not in ids]


class DebouncedLanes:
    """The debouncers and turn runners of one member's debounced lanes."""

    def __init__(
        self,
        redis: Redis,
        prefix: str,
        lanes: Sequence[Lane],
        settle: Callable[[Lane, TurnOutcome], Awaitable[bool]],
        *,
        max_concurrency: int,
        superseded: Callable[[str], None] | None = None,
        idempotency: IdempotencyGuard | None = None,
        cancelled: Callable[[Lane, Message], bool] | None = None,
        group: str = "",
    ) -> None:
        """Debounce ``lanes``; ``settle`` is told how each turn ended and routes failures.

        ``settle`` returns False when the turn must run again (its failure could not be routed
        or is to be retried). ``superseded(lane)`` is told of each message that replaced its
        conversation's scheduled turn (the member's Prometheus counter). ``idempotency`` backs
        a turn's ``ctx.once``, as it does a message's: the turn's event is named by all its
        messages in record order (:func:`turn_event`), so a retry of the same turn skips an
        effect that ran, and a turn that a message joined (during its backoff, or ahead of its
        redriven dead letters) runs it again; a done record under the turn's last message, the
        name an earlier release gave it, counts too. ``cancelled(lane, message)`` says (and
        counts) whether a buffered message is cancelled work (``pipeline cancel``): it is left
        out of its turn when the turn comes up, and a turn of cancelled messages only is not run.
        ``group``: the consumer group, named on each turn's span.
        """
        self._group = group
        self._lanes = {lane.name: lane for lane in lanes}
        self._idempotency = idempotency
        self._cancelled = cancelled
        self._payloads = Payloads(lanes)  # buffered references are resolved when the turn runs
        self._settle = settle
        self._running: dict[int, list[Message]] = {}  # per running turn, by its Turn's id
        self._keyless: set[str] = set()  # lanes that logged a message naming no conversation
        self.debouncers: dict[str, Debouncer] = {}
        self.runners: dict[str, TurnRunner] = {}
        for lane in lanes:
            assert lane.spec.debounce is not None  # noqa: S101 - only debounced lanes
            debouncer = Debouncer(
                redis,
                prefix,
                lane.name,
                lane.spec.debounce,
                held_ttl_ms=max(HELD_TTL_MS, lane.spec.retention_ms or 0),
            )
            if superseded is not None:
                debouncer.on_superseded(functools.partial(superseded, lane.name))
            self.debouncers[lane.name] = debouncer
            self.runners[lane.name] = TurnRunner(
                debouncer,
                functools.partial(self._run, lane),
                max_concurrency=max_concurrency,
            )

    async def record(self, lane: Lane, event: Any, message: Message) -> None:
        """Buffer ``message`` for its conversation's next turn (raises DebounceUnavailable)."""
        assert lane.spec.debounce is not None  # noqa: S101
        field = lane.spec.debounce.key
        key = key_value(event, message, field)
        if key is None:
            key = own_conversation(message)
            self._warn_keyless(lane, message, field)
        await self.debouncers[lane.name].record(key, message)

    def _warn_keyless(self, lane: Lane, message: Message, field: str) -> None:
        """Log, once per lane, that a message named no conversation in its ``debounce.key``."""
        if lane.name in self._keyless:
            return
        self._keyless.add(lane.name)
        instead = (
            "it coalesces by its message key instead"
            if message.key
            else "it has no message key either: it is a turn of its own (by its event id)"
        )
        log.warning(
            "lane %s: message %s@%d has no value in %r, the lane's debounce.key; %s. Have its"
            " producer set %r, or correct debounce.key in the lane's topics file (logged once"
            " per lane)",
            lane.name,
            message.tp,
            message.offset,
            field,
            instead,
            field,
        )

    def running_messages(self) -> list[Message]:
        """The messages of the turns whose handler runs here now (their settling included)."""
        return [m for messages in self._running.values() for m in messages]

    async def _run(self, lane: Lane, turn: Turn) -> bool:
        messages = [to_message(m) for m in turn.messages]
        event = turn_event(messages)  # cancelled messages count: it stays the turn that ran
        late_s = max(0, turn.fired_ms - turn.due_ms) / 1000
        first_ms = min(turn.arrivals_ms, default=0)
        if self._cancelled is not None:
            kept = [m for m in messages if not self._cancelled(lane, m)]
            if len(kept) < len(messages):
                await self._settle(lane, TurnOutcome(_left(messages, kept), "cancelled", None, 0))
                if not kept:
                    return True
                messages = kept
        if turn.attempt > lane.routes.max_attempts:
            # Every run it was allowed started and never finished (its member died, or hung
            # past its lease): running it again would only take down one more member.
            poison = PoisonMessage(
                f"the turn of {turn.key!r} started {turn.attempt - 1} times and never finished"
            )
            outcome = TurnOutcome(
                messages, "exhausted", poison, late_s, None, turn.attempt - 1, turn.first_failure_ms
            )
            return await self._settle(lane, outcome)
        self._running[id(turn)] = messages
        try:
            return await self._run_handler(lane, turn, messages, event, late_s, first_ms)
        finally:
            del self._running[id(turn)]

    async def _run_handler(
        self,
        lane: Lane,
        turn: Turn,
        messages: list[Message],
        event: str,
        late_s: float,
        first_ms: int,
    ) -> bool:
        """Call the lane's handler with the turn's events and settle how it ended.

        ``event`` names the turn for ``ctx.once`` (:func:`turn_event`).
        """
        called = time.perf_counter()
        error: Exception | None = None
        try:
            with tracing.turn(lane.name, messages, first_ms, turn.fired_ms, self._group):
                events = [
                    await self._payloads.event(lane, m) if OFFLOAD in m.headers else lane.decode(m)
                    for m in messages
                ]
                context = Context(
                    messages[-1],
                    lane.name,
                    turn.attempt,
                    self._idempotency,
                    once_event=event,
                    once_also=event_name(messages[-1]),  # an earlier release's name of the turn
                )
                await lane.handler(events, context)
        except Skip:
            ended = "skipped"
        except Exception as exc:  # every turn failure is settled, none escapes
            ended = "exhausted" if turn.attempt >= lane.routes.max_attempts else "failed"
            error = exc
        else:
            ended = "handled"
        ran_s = time.perf_counter() - called
        outcome = TurnOutcome(
            messages, ended, error, late_s, ran_s, turn.attempt, turn.first_failure_ms
        )
        return await self._settle(lane, outcome)
