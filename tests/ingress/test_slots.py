"""Admission at the edge: bounded slots, handover to waiters, shedding, Retry-After."""

from __future__ import annotations

import asyncio

from logstore.helpers import FakeClock

from pipeline.ingress.slots import DrainRate, SourceSlots


def test_drain_rate_converges_to_the_completion_rate() -> None:
    """Ten completions a second read as about ten, held while idle, falling when stalled."""
    clock = FakeClock(0.0)
    rate = DrainRate(tau_s=1.0, clock=clock)
    rate.busy()
    for _ in range(100):
        clock.advance(0.1)
        rate.record()
    assert 9.0 < rate.per_s() < 11.0
    rate.idle()
    clock.advance(5)
    assert 9.0 < rate.per_s() < 11.0
    rate.busy()
    clock.advance(5)
    assert rate.per_s() < 0.1


async def test_slots_are_bounded_and_handed_to_the_oldest_waiter() -> None:
    """With every slot taken a waiter gets the next released slot; past the timeout it is shed."""
    admission = SourceSlots(max_in_flight=1, queue_timeout_ms=5_000, max_retry_after_s=60)
    assert await admission.acquire()
    waiter = asyncio.create_task(admission.acquire())
    while admission.waiting == 0:  # noqa: ASYNC110 - polls a count; no event signals it
        await asyncio.sleep(0)
    admission.release()
    assert await waiter
    assert admission.in_flight == 1
    impatient = SourceSlots(max_in_flight=1, queue_timeout_ms=0, max_retry_after_s=60)
    assert await impatient.acquire()
    assert not await impatient.acquire()


async def test_a_waiter_that_times_out_does_not_leak_a_slot() -> None:
    """A shed waiter leaves the slot count as it was."""
    admission = SourceSlots(max_in_flight=1, queue_timeout_ms=20, max_retry_after_s=60)
    assert await admission.acquire()
    assert not await admission.acquire()
    admission.release()
    assert admission.in_flight == 0
    assert await admission.acquire()


def test_retry_after_follows_the_drain_rate() -> None:
    """Retry-After is the work ahead over the drain rate, clamped to [1, max]."""
    clock = FakeClock(0.0)
    admission = SourceSlots(
        max_in_flight=100, queue_timeout_ms=0, max_retry_after_s=30, clock=clock
    )
    assert admission.retry_after_s() == 2  # nothing drained yet: the cold-start default
    admission._drain.busy()
    for _ in range(50):
        clock.advance(0.1)
        admission._drain.record()
    admission._free = 0  # 100 in flight, draining about 10 a second
    assert 9 <= admission.retry_after_s() <= 11
    admission._free = 99
    assert admission.retry_after_s() == 1
