"""The idempotency guard: run a side effect once per event, even when the event is redelivered.

``await ctx.once("send-reply", send)`` runs ``send()`` unless a previous delivery of the same
event (same event id, or same origin message) already ran it to success. What it guarantees:

* after ``send()`` returned and its success was recorded, it never runs again for that event
  for as long as the record is kept: the longest any of the lane's topics keeps a copy of the
  event (its dead letters wait at least two weeks, longer on a lane retaining more) plus its
  retry path (:func:`once_ttl_ms`; :data:`ONCE_TTL_MS`, 15 days, for a lane the guard was not
  told of), and again that long after each delivery that finds it done. So a dead letter
  redriven at the end of its topic's retention, after the effect ran, does not run it again;
  past that bound it does;
* two deliveries of one event never run it at the same time: the second waits (backing off,
  for at most about one lease) until the first recorded its end, then returns or runs it; only
  if the claim is still held after that does it raise ``Retry`` and come back later;
* if ``send()`` raises, nothing is recorded and a retry may run it again;
* the claim is renewed every third of ``lease_ms`` while ``send()`` runs, so a long effect keeps
  it; if the process dies, the claim lapses within ``lease_ms`` (the member passes
  ``runtime.liveness_ms``, 5 s, how long it counts as alive anywhere else) and a redelivery
  takes it over. If it dies after ``send()`` finished but before the record (one Redis round
  trip), the next delivery runs it again. Side effects that must
  never repeat even then need the receiving end's own idempotency key: pass ``ctx.event_id``.

An event may also be known by an earlier name (``also_done``: a debounced turn's last message,
which named the turn before turns were named by all their messages): a done record under it
counts as this event's, and is copied to the event's own record; a run under it makes this one
wait, as a run under the event's own name does.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TypeVar

from redis.asyncio import Redis
from redis.exceptions import RedisError

from pipeline.errors import Retry
from pipeline.retry.guard_store import copy_lifetime_ms
from pipeline.runtime.keys import once_key
from pipeline.runtime.once_functions import Claim, OnceFunctions
from pipeline.topics.spec import DLQ_MIN_RETENTION_MS, TopicSpec

T = TypeVar("T")

ONCE_TTL_MS = DLQ_MIN_RETENTION_MS + 86_400_000
"""How long a done record is kept on a lane the guard has no bound for (15 days): a dead-letter
topic's least retention, two weeks, and a day for the retry path before it."""


def once_ttl_ms(spec: TopicSpec) -> int:
    """How long a done record of ``spec``'s lane is kept: as long as its topics keep a copy.

    :func:`~pipeline.retry.guard_store.copy_lifetime_ms`: the effect ran at the latest before
    the message was dead-lettered, and a redrive may come as late as its dead letter's last day.
    """
    return copy_lifetime_ms(spec)


def lane_once_ttls(specs: Sequence[TopicSpec]) -> dict[str, int]:
    """:func:`once_ttl_ms` of each lane (the longest of a lane's declarations)."""
    ttls: dict[str, int] = {}
    for spec in specs:
        ttls[spec.lane] = max(ttls.get(spec.lane, 0), once_ttl_ms(spec))
    return ttls


class IdempotencyGuard:
    """Records side effects in Redis per (lane, event, name)."""

    def __init__(
        self,
        client: Redis,
        prefix: str,
        *,
        lease_ms: int = 15_000,
        lane_ttl_ms: Mapping[str, int] | None = None,
        ttl_ms: int | None = None,
    ) -> None:
        """Keep records under ``prefix``; a claim lapses after ``lease_ms``.

        A done record of lane L is kept ``lane_ttl_ms[L]`` (:func:`lane_once_ttls`), one of a
        lane not in it ``ttl_ms`` (:data:`ONCE_TTL_MS` if None).
        """
        self._functions = OnceFunctions(client)
        self._prefix = prefix
        self._lease_ms = lease_ms
        self._lane_ttl_ms = dict(lane_ttl_ms or {})
        self._ttl_ms = ONCE_TTL_MS if ttl_ms is None else ttl_ms

    def ttl_ms(self, lane: str) -> int:
        """How long a done record of ``lane`` is kept after its last use."""
        return self._lane_ttl_ms.get(lane, self._ttl_ms)

    async def once(
        self,
        lane: str,
        event: str,
        name: str,
        effect: Callable[[], Awaitable[T]],
        *,
        also_done: str | None = None,
    ) -> T | None:
        """Run ``effect`` unless it already succeeded for this event; returns its result or None.

        ``also_done``: an earlier name of the event, whose done record counts as its own.

        Raises:
            Retry: another delivery of the same event is running the effect right now.
        """
        key = once_key(self._prefix, lane, event, name)
        earlier = None if also_done is None else once_key(self._prefix, lane, also_done, name)
        token = uuid.uuid4().hex
        ttl_ms = self.ttl_ms(lane)
        state = await self._claim(key, token, ttl_ms, earlier)
        if state == "done":
            return None
        if state == "busy":
            raise Retry(f"side effect {name!r} of {event} is running in another delivery")
        renewer = asyncio.create_task(self._renew(key, token))
        try:
            result = await effect()
        except BaseException:
            renewer.cancel()
            await self._functions.settle(key, token, done=False, ttl_ms=0)
            raise
        renewer.cancel()
        await self._functions.settle(key, token, done=True, ttl_ms=ttl_ms)
        return result

    async def _claim(self, key: str, token: str, ttl_ms: int, earlier: str | None) -> Claim:
        """Claim the record, waiting out a claim held by another delivery for about a lease.

        A record found done is kept ``ttl_ms`` again. ``earlier``: the record under the event's
        earlier name, read once the claim is ours (:meth:`_earlier`).
        """
        pause_s = 0.05
        deadline = time.monotonic() + self._lease_ms / 1000 + 1.0
        while True:
            state = await self._functions.claim(key, token, self._lease_ms, ttl_ms=ttl_ms)
            if state == "claimed" and earlier is not None:
                try:
                    state = await self._earlier(key, token, ttl_ms, earlier)
                except BaseException:  # Redis failed, or we were cancelled: give the claim up
                    await self._release(key, token)
                    raise
            if state != "busy" or time.monotonic() + pause_s > deadline:
                return state
            # Another delivery runs it (or died running it: its claim lapses within a lease).
            await asyncio.sleep(pause_s)
            pause_s = min(pause_s * 2, 1.0)

    async def _earlier(self, key: str, token: str, ttl_ms: int, earlier: str) -> Claim:
        """Our claim of ``key``, given what the record under the earlier name holds.

        Done there (a member of an earlier release ran the effect): ``key`` is recorded done as
        well. Running there: our claim is given up, and we wait as for a claim of ``key``. A
        holder that claims it there between this read and our run is not seen: both run (only
        a member of an earlier release running the same event at the same time claims there).
        If this raises, the caller gives our claim up (:meth:`_release`).
        """
        found = await self._functions.read(earlier)
        if found is None:
            return "claimed"
        if found == "done":
            await self._functions.settle(key, token, done=True, ttl_ms=ttl_ms)
            return "done"
        await self._functions.settle(key, token, done=False, ttl_ms=0)
        return "busy"

    async def _release(self, key: str, token: str) -> None:
        """Give up our claim of ``key`` before its effect ran (else it lapses in a lease)."""
        with contextlib.suppress(RedisError, OSError):
            await self._functions.settle(key, token, done=False, ttl_ms=0)

    async def _renew(self, key: str, token: str) -> None:
        while True:
            await asyncio.sleep(self._lease_ms / 3000)
            try:
                await self._functions.renew(key, token, self._lease_ms)
            except (RedisError, OSError):  # unreachable: the claim may lapse, as documented
                return
