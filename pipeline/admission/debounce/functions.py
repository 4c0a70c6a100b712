"""The Redis Functions library ``lua/debounce.lua`` and typed wrappers around its functions.

One :class:`DebounceFunctions` per (lane, Redis client) builds every key name through
:mod:`pipeline.admission.debounce.keys` and turns each reply into a typed value; the Lua
header says what each function does. The library is loaded once per client under its versioned
name (:mod:`pipeline.redis_functions`) and reloaded if Redis lost it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any, Literal

from redis.asyncio import Redis

from pipeline.admission.debounce import keys
from pipeline.redis_functions import FunctionLibrary

LIBRARY = resources.files("pipeline.admission.debounce").joinpath("lua/debounce.lua").read_text()

Outcome = Literal["done", "scheduled", "lost"]
"""How a turn ended: nothing left buffered; a next turn scheduled; lease lost (no change)."""

Renewal = Literal["renewed", "taken", "lost"]
"""What a renewal found: the lease extended; taken over by a claim; gone, taken by none."""

RawTurn = list[Any]
"""A leased turn as the Lua returns it: key, token, attempt, due_ms, first_failure_ms (-1: none),
then "arrival:message"."""


@dataclass(frozen=True, slots=True)
class Recorded:
    """The reply of ``db_record``: when the key's turn is due and what the record did."""

    due_ms: int
    superseded: bool
    buffered: int
    now_ms: int
    woke: bool


@dataclass(frozen=True, slots=True)
class Leased:
    """The reply of ``db_claim`` / ``db_step``: the leased turns and the timer to hold.

    Attributes:
        now_ms: Redis time of the call.
        timer_ms: the due time the caller now holds a timer for, or None.
        stale: due entries that had nothing left to run.
        outcomes: per finished turn (``db_step`` only), how it ended, in the order given.
        turns: the leased turns, earliest due first.
        backup_ms: (``db_step`` only) when the hold of the runner that holds the timer for the
            lane's next due time expires in Redis, if another runner holds it; else None.
    """

    now_ms: int
    timer_ms: int | None
    stale: int
    outcomes: tuple[Outcome, ...]
    turns: tuple[RawTurn, ...]
    backup_ms: int | None = None


@dataclass(frozen=True, slots=True)
class Finished:
    """The reply of ``db_finish``: the outcome and the next turn's due time, if any."""

    outcome: Outcome
    due_ms: int | None
    buffered: int


@dataclass(frozen=True, slots=True)
class Ending:
    """One finished turn handed to ``db_step``: its key, lease token, success and backoff."""

    key: str
    token: str
    ok: bool
    retry_in_ms: int


class DebounceFunctions(FunctionLibrary):
    """Calls into the ``pipeline_debounce`` library for one lane on one Redis client."""

    def __init__(self, client: Redis, prefix: str, lane: str, *, owner: str, grace_ms: int) -> None:
        """Bind to ``client`` and the keys of ``lane`` under ``prefix``.

        Args:
            client: a client returning bytes.
            prefix: the key prefix.
            lane: the lane's name.
            owner: the id under which this caller holds the lane's timer.
            grace_ms: how long past an armed due time before a record treats its timer as lost.
        """
        super().__init__(client, LIBRARY)
        self.owner = owner
        self.prefix = prefix
        self.lane = lane
        self.grace_ms = grace_ms
        self.due_key = keys.due_key(prefix, lane)
        self.armed_key = keys.armed_key(prefix, lane)
        self.wake_key = keys.wake_key(prefix, lane)
        self.key_prefix = keys.key_prefix(prefix, lane)
        self.slot_guard = keys.slot_guard(prefix, lane)
        self.step_key = keys.step_key(prefix, lane, owner)

    async def record(
        self,
        key: str,
        message_id: str,
        data: bytes,
        quiet_ms: int,
        max_wait_ms: int,
        batch: int,
        timestamp_ms: int = 0,
        event: str = "",
        held_ttl_ms: int = 604_800_000,
    ) -> Recorded:
        """``db_record``: buffer one encoded message for ``key`` and (re)schedule its turn.

        ``event`` is a digest of the message's event id (hex digits; "" when it has none): where
        a buffered event waits is kept for :meth:`held` until the finish that takes it out of
        the buffer, ``held_ttl_ms`` at most (a bound against a locator no finish deleted).
        ``due_ms`` is -1 when the message, or a copy of its event still buffered, was recorded
        already (see the Lua).
        """
        names = [*keys.conversation_keys(self.prefix, self.lane, key), self.armed_key]
        names.append(self.wake_key)
        if event:
            names.append(keys.event_key(self.prefix, self.lane, event))
            names.append(keys.locators_key(self.prefix, self.lane, key))
        args = [key, message_id, data, quiet_ms, max_wait_ms, batch, self.grace_ms, timestamp_ms]
        reply = await self.fcall("db_record", names, [*args, event, held_ttl_ms])
        return Recorded(
            int(reply[0]), bool(int(reply[1])), int(reply[2]), int(reply[3]), bool(int(reply[4]))
        )

    async def held(self, events: Sequence[str], keep_ms: int) -> list[bool]:
        """``db_held``: per event digest, whether its message still waits in a buffer.

        A held event stays findable at least ``keep_ms`` more.
        """
        if not events:
            return []
        names = [keys.event_key(self.prefix, self.lane, event) for event in events]
        reply = await self.fcall("db_held", names, [self.key_prefix, keep_ms])
        return [bool(int(found)) for found in reply]

    async def claim(self, limit: int, lease_ms: int, max_batch: int, token: str) -> Leased:
        """``db_claim``: lease up to ``limit`` due turns; the caller takes the lane's timer."""
        reply = await self.fcall(
            "db_claim",
            [self.due_key, self.armed_key, self.slot_guard],
            [limit, lease_ms, max_batch, token, self.key_prefix, self.grace_ms, self.owner],
        )
        return Leased(int(reply[0]), _due(reply[1]), int(reply[2]), (), tuple(reply[3:]))

    async def step(
        self,
        limit: int,
        lease_ms: int,
        token: str,
        endings: Sequence[Ending],
        policy: tuple[int, int, int],
        idle_ttl_ms: int,
        pass_at: int = 0,
    ) -> Leased:
        """``db_step``: finish ``endings``, then lease up to ``limit`` due turns (0: none).

        ``policy`` is (quiet_ms, max_wait_ms, max_batch). Leasing ``pass_at`` turns or more
        (0: never) passes the lane's timer to the next blocked runner instead of taking it.
        Leasing nothing while another runner holds the timer returns when that hold expires.
        A call sent again with the same ``token`` (its reply lost) gets the first call's reply.
        """
        quiet_ms, max_wait_ms, max_batch = policy
        args: list[Any] = [
            limit,
            lease_ms,
            max_batch,
            token,
            self.key_prefix,
            self.grace_ms,
            quiet_ms,
            max_wait_ms,
            idle_ttl_ms,
            self.owner,
            pass_at,
            len(endings),
        ]
        for ending in endings:
            args += (ending.key, ending.token, "1" if ending.ok else "0", ending.retry_in_ms)
        reply = await self.fcall(
            "db_step",
            [self.due_key, self.armed_key, self.wake_key, self.slot_guard, self.step_key],
            args,
        )
        outcomes = tuple(_outcome(o) for o in reply[3])
        return Leased(
            int(reply[0]), _due(reply[1]), int(reply[2]), outcomes, tuple(reply[5:]), _due(reply[4])
        )

    async def finish(
        self,
        ending: Ending,
        policy: tuple[int, int, int],
        idle_ttl_ms: int,
    ) -> Finished:
        """``db_finish``: end one turn; ``policy`` is (quiet_ms, max_wait_ms, max_batch)."""
        quiet_ms, max_wait_ms, max_batch = policy
        names = [*keys.conversation_keys(self.prefix, self.lane, ending.key), self.armed_key]
        names.append(keys.locators_key(self.prefix, self.lane, ending.key))
        args = [
            ending.key,
            ending.token,
            "1" if ending.ok else "0",
            ending.retry_in_ms,
            quiet_ms,
            max_wait_ms,
            max_batch,
            idle_ttl_ms,
            self.grace_ms,
            self.owner,
        ]
        reply = await self.fcall("db_finish", names, args)
        return Finished(_outcome(reply[0]), _due(reply[1]), int(reply[2]))

    async def renew(self, key: str, token: str, lease_ms: int) -> Renewal:
        """``db_renew``: extend a running turn's lease (``renewed``).

        ``taken``: a claim displaced the token (its lease lapsed and the turn was claimed
        again); ``lost``: the token no longer holds the lease and no claim displaced it (the
        state gone with Redis's data, a new turn claimed since or not).
        """
        state = keys.state_key(self.prefix, self.lane, key)
        reply = int(await self.fcall("db_renew", [self.due_key, state], [key, token, lease_ms]))
        return "renewed" if reply > 0 else "taken" if reply < 0 else "lost"

    async def next_due(self) -> int | None:
        """``db_next``: the lane's earliest due time (Redis clock, ms), or None."""
        reply = await self.fcall("db_next", [self.due_key], [])
        return _due(reply[1])

    async def wake(self, due_ms: int) -> None:
        """``db_wake``: hand the timer for ``due_ms`` to a runner blocked on the wake list."""
        await self.fcall("db_wake", [self.wake_key, self.armed_key], [due_ms, self.grace_ms])

    async def wait_wake(self, client: Redis, timeout_s: float) -> int | None:
        """Block on the wake list at most ``timeout_s``; the due time popped, or None.

        ``client`` holds a connection of its own (the blocked read occupies it).
        """
        popped = await client.blpop([self.wake_key], timeout=timeout_s)
        return None if popped is None else int(popped[1])


def _due(value: Any) -> int | None:
    due = int(value)
    return None if due < 0 else due


def _outcome(value: Any) -> Outcome:
    text = value.decode() if isinstance(value, bytes) else str(value)
    if text not in ("done", "scheduled", "lost"):
        raise ValueError(f"unknown debounce outcome {text!r}")
    return text  # type: ignore[return-value]
