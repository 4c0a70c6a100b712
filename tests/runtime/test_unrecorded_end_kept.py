"""An end on a parked key that Redis did not answer: what happens before it is sent again.

A parked key's head whose copy ran while Redis gave no answer keeps its end (``done``) to send
again at the member's next tick, and its start mark is ended through the next batched call.
Two moments come before either:

* the member stops (SIGTERM): its kept ends went with the process, so the followers held
  behind the head waited until their state expired (days), then were gone without a word;
* Redis answers again, and another member reads the head's next retry copy (its route was
  refused too) before this member's batched call ended the mark that still named the copy
  that failed: that copy was dropped as a duplicate of a run still going, its offset
  committed, and the followers never ran.

Two run guards on the real Redis (``runtime.guard_parts``); Redis's silence is the timeouts of
``parking_calls_time_out``.
"""

from __future__ import annotations

import asyncio

import pytest
from redis import exceptions as rexc
from redis.asyncio import Redis
from runtime.guard_parts import (
    Handlers,
    guarded_lane,
    main_message,
    member_guard,
    parking_calls_time_out,
    retry_copy,
)
from runtime.helpers import eventually, join
from runtime.owned import prefix

from pipeline import headers as h
from pipeline.envelope import Message
from pipeline.runtime.app import Lane
from pipeline.runtime.guard import RunGuard

__all__ = ["prefix"]  # the fixture: a key prefix of the test's own, its keys deleted after


def third_copy(lane: Lane, origin_offset: int, offset: int, value: bytes) -> Message:
    """The copy of main offset ``origin_offset`` in the second retry tier, as attempt 3."""
    headers = {
        h.ORIGIN_TOPIC: lane.spec.name.encode(),
        h.ORIGIN_PARTITION: b"0",
        h.ORIGIN_OFFSET: str(origin_offset).encode(),
        h.ATTEMPT: b"3",
    }
    return Message(lane.routes.retry_topics[1], 0, offset, b"k", value, headers)


async def parked_with_follower(a: RunGuard, lane: Lane, handlers: Handlers) -> None:
    """k:0 fails on ``a`` and parks its key; k:1 is held behind it."""
    handlers.outcomes[b"k:0"] = ["retried"]
    assert await a.run(lane, main_message(lane, 0, b"k:0")) == "retried"
    assert await a.run(lane, main_message(lane, 1, b"k:1")) == "parked"


def ran(handlers: Handlers, value: bytes) -> bool:
    """Whether ``value`` ran in either member."""
    return any(run[1] == value for run in handlers.runs)


async def test_an_end_kept_at_shutdown_still_releases_the_followers(
    redis: Redis, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """k:0's copy succeeds on A while Redis is silent; A stops once it answers: k:1 runs on B."""
    lane = guarded_lane(f"closekept_{prefix}")
    handlers = Handlers()
    a = member_guard(redis, prefix, lane, handlers, "a")
    b = member_guard(redis, prefix, lane, handlers, "b")
    await parked_with_follower(a, lane, handlers)
    parking_calls_time_out(monkeypatch, a._stores[lane.name])
    assert await a.run(lane, retry_copy(lane, 0, 0, b"k:0")) == "handled"  # its end: no answer
    monkeypatch.undo()  # Redis answers again, before A's next tick
    await a.flush()
    await a.close()  # SIGTERM
    try:
        # B takes the key's release over once its lease lapsed (each tick, as a member does).
        async def ticking() -> None:
            while not ran(handlers, b"k:1"):
                await b.tick({lane.name: lane})
                await asyncio.sleep(0.05)

        await asyncio.wait_for(ticking(), 10)
    except TimeoutError:
        raise AssertionError(
            "k:1 never ran: the end of k:0 that A kept went with A, and k:1 waits behind a head"
            " that already ran until its state expires"
        ) from None
    finally:
        await b.close()
    assert [run[1] for run in handlers.runs] == [b"k:0", b"k:0", b"k:1"]


async def test_a_copy_read_before_the_failed_run_is_ended_is_not_dropped(
    redis: Redis, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """k:0's copy fails again on A while Redis is silent; B reads the next copy: it runs."""
    lane = guarded_lane(f"copykept_{prefix}")
    handlers = Handlers()
    a = member_guard(redis, prefix, lane, handlers, "a")
    b = member_guard(redis, prefix, lane, handlers, "b")
    try:
        await parked_with_follower(a, lane, handlers)
        handlers.outcomes[b"k:0"] = ["retried", "handled"]
        parking_calls_time_out(monkeypatch, a._stores[lane.name])
        # Its copy 3 was produced; the end that parks the key again got no answer.
        assert await a.run(lane, retry_copy(lane, 0, 0, b"k:0")) == "retried"
        monkeypatch.undo()  # Redis answers again
        copy = asyncio.create_task(b.run(lane, third_copy(lane, 0, 0, b"k:0")))
        await eventually(lambda: copy.done() or b._stats.busy_waits > 0, timeout_s=10)
        await a.flush()  # A's next batched call ends its copy's mark
        outcome = await asyncio.wait_for(copy, 10)
        assert outcome == "handled", (
            f"B's copy 3 of k:0 was {outcome}: dropped while its mark named A's run that had"
            " ended, its offset committed; k:1 waits behind it for ever"
        )
        assert [run[1] for run in handlers.runs] == [b"k:0", b"k:0", b"k:0", b"k:1"]
    finally:
        await a.close()
        await b.close()


async def test_a_dead_letter_recorded_late_does_not_sequence_a_key_parked_since(
    redis: Redis, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """k:0 is dead-lettered while Redis is silent; k:1 parks the key before its end is sent.

    k:0 was never parked: its late end must not dead-letter k:1 and k:2, parked after it, as
    followers of a dead-lettered head (``after_dead_letter: follow``).
    """
    lane = guarded_lane(f"deadkept_{prefix}")
    handlers = Handlers()
    a = member_guard(redis, prefix, lane, handlers, "a")
    try:
        handlers.outcomes[b"k:0"] = ["dead_lettered"]
        parking_calls_time_out(monkeypatch, a._stores[lane.name])
        assert await a.run(lane, main_message(lane, 0, b"k:0")) == "dead_lettered"
        monkeypatch.undo()  # Redis answers again, before A's next tick
        handlers.outcomes[b"k:1"] = ["retried"]
        assert await a.run(lane, main_message(lane, 1, b"k:1")) == "retried"
        assert await a.run(lane, main_message(lane, 2, b"k:2")) == "parked"
        await a.tick({lane.name: lane})  # k:0's end, sent again
        outcome = await a.run(lane, retry_copy(lane, 1, 0, b"k:1"))
        assert outcome == "handled", f"k:1's copy was {outcome}, sequenced behind k:0"
        await eventually(lambda: ran(handlers, b"k:2"), timeout_s=10)
    finally:
        await a.close()
    assert [run[1] for run in handlers.runs] == [b"k:0", b"k:1", b"k:1", b"k:2"]


async def test_a_head_copy_run_while_redis_is_silent_still_releases_its_followers(
    redis: Redis, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """k:0's copy is let through unasked (its start got no answer): its end still releases k:1.

    The guard fails open: the copy ran without Redis saying it is its parked key's head, so
    its end went with the ordinary ends (which only end start marks) and k:0 stayed the head.
    """
    lane = guarded_lane(f"openkept_{prefix}")
    handlers = Handlers()
    a = member_guard(redis, prefix, lane, handlers, "a")
    store = a._stores[lane.name]
    try:
        await parked_with_follower(a, lane, handlers)
        parking_calls_time_out(monkeypatch, store)

        async def begin_timed_out(*_: object) -> object:
            raise rexc.TimeoutError("Timeout reading from socket")

        monkeypatch.setattr(store, "begin_many", begin_timed_out)
        assert await a.run(lane, retry_copy(lane, 0, 0, b"k:0")) == "handled"
        monkeypatch.undo()  # Redis answers again
        await a.flush()
        await a.tick({lane.name: lane})
        await eventually(lambda: ran(handlers, b"k:1"), timeout_s=10)
    except AssertionError:
        raise AssertionError(
            f"k:1 never ran; parked keys: {await store.parked_count()} (k:0 still its head)"
        ) from None
    finally:
        await a.close()
    assert [run[1] for run in handlers.runs] == [b"k:0", b"k:0", b"k:1"]


async def test_a_key_run_while_redis_was_silent_is_still_asked_once_it_answers(
    redis: Redis, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """k:2 runs unasked while Redis is silent; once it answers, k:3 is held behind k:0's copy.

    A message let through because Redis did not answer says nothing about its key: before, it
    counted as found not parked, and the key's next first deliveries ran on the claimed path
    (no Redis call) ahead of the head's copy and the followers held behind it, for good.
    """
    lane = guarded_lane(f"claimkept_{prefix}")
    handlers = Handlers()
    a = member_guard(redis, prefix, lane, handlers, "a", claims=True)
    store = a._stores[lane.name]
    messages = [main_message(lane, n, b"k:%d" % n) for n in range(4)]
    try:
        await join(a, lane, messages)
        await parked_with_follower(a, lane, handlers)
        parking_calls_time_out(monkeypatch, store)

        async def begin_timed_out(*_: object) -> object:
            raise rexc.TimeoutError("Timeout reading from socket")

        monkeypatch.setattr(store, "begin_many", begin_timed_out)
        assert await a.run(lane, messages[2]) == "handled"  # unguarded while Redis is silent
        monkeypatch.undo()  # Redis answers again
        assert await a.run(lane, messages[3]) == "parked", "k:3 ran ahead of k:0's copy and k:1"
    finally:
        await a.close()
