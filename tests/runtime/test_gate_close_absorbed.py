"""The throttle gate's close ends though an acquisition lost its cancellation (CPython 86296)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from redis.asyncio import Redis
from runtime.helpers import eventually

from pipeline import headers as h
from pipeline.admission.adaptive import Feedback
from pipeline.admission.throttle import Permit, Throttle
from pipeline.envelope import Message
from pipeline.runtime.throttle_gate import ThrottleGate
from pipeline.topics.spec import ThrottlePolicy


class AbsorbingThrottle:
    """The real throttle, whose waiting acquisitions lose their first cancellation.

    On Python 3.11 ``asyncio.wait_for`` (redis-py writes under it) returns the reply instead of
    raising when the cancellation lands as the reply arrives; the acquisition then waits on.
    """

    def __init__(self, inner: Throttle) -> None:
        """Admit through ``inner``."""
        self.inner = inner
        self.asked = 0
        self.absorbed = 0

    async def acquire(
        self, keys: Sequence[str], *, priority: int = 0, lease_ms: int | None = None
    ) -> Any:
        """Wait for the slots; a first cancellation is lost and the wait goes on."""
        self.asked += 1
        while True:
            try:
                return await self.inner.acquire(keys, priority=priority, lease_ms=lease_ms)
            except asyncio.CancelledError:
                if self.absorbed:
                    raise
                self.absorbed += 1

    async def release(self, permit: Permit, feedback: Sequence[Feedback] = ()) -> None:
        """Release through the real throttle."""
        await self.inner.release(permit, feedback)


async def test_the_gates_close_ends_though_an_acquisition_lost_its_cancellation(
    redis_service: str, unique: str
) -> None:
    """close() cancels its acquisitions again until they end; it used to wait for ever.

    (In a member's stop the revocation withdraws them first, so this close is the gate's own.)
    """
    client = Redis.from_url(redis_service)
    throttle = Throttle(client, prefix=f"t{unique}", namespace=unique)
    await throttle.start()
    try:
        await throttle.set_limit("org:acme", 1)
        held = await throttle.acquire(["org:acme"])  # the one slot: the gate's message waits
        absorbing = AbsorbingThrottle(throttle)
        admitted: list[Message] = []
        gate: ThrottleGate[Message] = ThrottleGate(absorbing, admitted.append, admitted.append)
        policy = ThrottlePolicy(keys=("org:{tenant}",))
        message = Message("t", 0, 0, b"k", b"{}", {h.TENANT: b"acme"})
        gate.offer(message, policy, "lane", ordered=True, busy=False, can_defer=False)
        await eventually(lambda: throttle.waited == 1)
        closing = asyncio.create_task(gate.close())
        await asyncio.wait([closing], timeout=10)  # not wait_for: close swallowed its cancel
        assert closing.done(), "the gate's close still waits for the acquisition"
        assert absorbing.absorbed == 1
        assert admitted == []
        await throttle.release(held)
    finally:
        await throttle.close()
        await client.aclose()
