"""The idempotency guard: run a side effect once per event, even when the event is redelivered.

``await ctx.once("send-reply", send)`` runs ``send()`` unless a previous delivery of the same
event (same event id, or same origin message) already ran it to success. What it guarantees:

* after ``send()`` returned and its success was recorded, it never runs again for that event
  (for ``ttl_s``, default 7 days);
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
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import TypeVar

from redis.asyncio import Redis
from redis.exceptions import RedisError

from pipeline.errors import Retry
from pipeline.runtime.keys import once_key
from pipeline.runtime.once_functions import Claim, OnceFunctions

T = TypeVar("T")


class IdempotencyGuard:
    """Records side effects in Redis per (lane, event, name)."""

    def __init__(
        self, client: Redis, prefix: str, *, lease_ms: int = 15_000, ttl_s: int = 7 * 86_400
    ) -> None:
        """Keep records under ``prefix``; a claim lapses after ``lease_ms``."""
        self._functions = OnceFunctions(client)
        self._prefix = prefix
        self._lease_ms = lease_ms
        self._ttl_ms = ttl_s * 1000

    async def once(
        self, lane: str, event: str, name: str, effect: Callable[[], Awaitable[T]]
    ) -> T | None:
        """Run ``effect`` unless it already succeeded for this event; returns its result or None.

        Raises:
            Retry: another delivery of the same event is running the effect right now.
        """
        key = once_key(self._prefix, lane, event, name)
        token = uuid.uuid4().hex
        state = await self._claim(key, token)
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
        await self._functions.settle(key, token, done=True, ttl_ms=self._ttl_ms)
        return result

    async def _claim(self, key: str, token: str) -> Claim:
        """Claim the record, waiting out a claim held by another delivery for about a lease."""
        pause_s = 0.05
        deadline = time.monotonic() + self._lease_ms / 1000 + 1.0
        while True:
            state = await self._functions.claim(key, token, self._lease_ms)
            if state != "busy" or time.monotonic() + pause_s > deadline:
                return state
            # Another delivery runs it (or died running it: its claim lapses within a lease).
            await asyncio.sleep(pause_s)
            pause_s = min(pause_s * 2, 1.0)

    async def _renew(self, key: str, token: str) -> None:
        while True:
            await asyncio.sleep(self._lease_ms / 3000)
            try:
                await self._functions.renew(key, token, self._lease_ms)
            except (RedisError, OSError):  # unreachable: the claim may lapse, as documented
                return
