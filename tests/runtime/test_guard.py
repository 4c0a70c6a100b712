"""The run guard on real Redis: copies never run beside each other, releases survive a dead member.

Two :class:`RunGuard` instances on one Redis stand for two live members of a group; the
handler stage is driven step by step so that the interleavings that once broke per-key order
are replayed exactly. The broker is the one collaborator faked here (the router's producer):
these tests are about the guard's decisions, not about producing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence

import pytest
from redis.asyncio import Redis
from runtime.guard_parts import (
    Handlers,
    Producer,
    guarded_lane,
    main_message,
    member_guard,
    retry_copy,
    routing_guard,
)
from runtime.helpers import eventually, lane_spec

from pipeline import headers as h
from pipeline.envelope import Delivered, Message, TopicPartition
from pipeline.retry.guard_store import (
    Decision,
    GuardStore,
    KeyEnds,
    Release,
    Start,
    lane_guards,
    start_of,
)
from pipeline.retry.policy import default_retryable
from pipeline.retry.router import RetryRouter
from pipeline.runtime.app import Lane
from pipeline.runtime.guard import RunGuard
from pipeline.runtime.isolation import Isolation
from pipeline.runtime.redirect import Redirector
from pipeline.runtime.starts import StartWindow
from pipeline.runtime.stats import Stats
from pipeline.topics.spec import TopicSpec

Decided = tuple[Decision, int]


async def test_a_second_copy_of_a_running_head_never_runs_beside_it(
    redis: Redis, unique: str, prefix: str
) -> None:
    """The stale-copy interleaving: copy B of X is dropped while copy A runs; Y runs after X."""
    lane = guarded_lane(f"guard_{unique}")
    handlers = Handlers()
    a, b = (member_guard(redis, prefix, lane, handlers, m) for m in ("a", "b"))
    handlers.outcomes[b"x"] = ["retried"]  # X fails once: its key parks
    assert await a.run(lane, main_message(lane, 0, b"x")) == "retried"
    assert await a.run(lane, main_message(lane, 1, b"y")) == "parked"  # Y is held behind X
    handlers.started.pop(b"x")
    handlers.hold[b"x"] = asyncio.Event()
    copy_a = asyncio.create_task(b.run(lane, retry_copy(lane, 0, 0, b"x")))
    await asyncio.wait_for(handlers.started.setdefault(b"x", asyncio.Event()).wait(), 10)
    # A second copy of X (its member died between producing it and committing) arrives at A.
    assert await a.run(lane, retry_copy(lane, 0, 1, b"x")) == "duplicate"
    handlers.hold[b"x"].set()
    assert await asyncio.wait_for(copy_a, 10) == "handled"
    assert [(m, v) for m, v, _, _ in handlers.runs] == [("a", b"x"), ("b", b"x"), ("b", b"y")]
    assert handlers.overlaps() == 0
    # A copy that shows up after X finished is stale, and the key is no longer parked.
    assert await a.run(lane, retry_copy(lane, 0, 2, b"x")) == "duplicate"
    assert await redis.hlen(f"{{{prefix}:guard:{lane.name}}}:parked") == 0


async def test_a_release_whose_member_died_is_taken_over(
    redis: Redis, unique: str, prefix: str
) -> None:
    """A member killed while running a released follower: another takes the release over."""
    lane = guarded_lane(f"guard_{unique}")
    handlers = Handlers()
    a, b = (member_guard(redis, prefix, lane, handlers, m) for m in ("a", "b"))
    handlers.outcomes[b"x"] = ["retried"]
    await a.run(lane, main_message(lane, 0, b"x"))
    await a.run(lane, main_message(lane, 1, b"y"))
    await a.run(lane, main_message(lane, 2, b"z"))
    handlers.hold[b"y"] = asyncio.Event()
    dying = asyncio.create_task(a.run(lane, retry_copy(lane, 0, 0, b"x")))
    await asyncio.wait_for(handlers.started.setdefault(b"y", asyncio.Event()).wait(), 10)
    dying.cancel()  # the member is gone: nothing renews its lease
    with pytest.raises(asyncio.CancelledError):
        await dying
    handlers.hold.pop(b"y").set()

    async def take_over() -> None:
        while not any(v == b"z" for _, v, _, _ in handlers.runs):
            await b.tick({lane.name: lane})
            await asyncio.sleep(0.05)

    await asyncio.wait_for(take_over(), 20)
    await eventually(lambda: not b._reaped)
    values = [(m, v) for m, v, _, _ in handlers.runs]
    assert values == [("a", b"x"), ("a", b"x"), ("b", b"y"), ("b", b"z")]
    assert await redis.hlen(f"{{{prefix}:guard:{lane.name}}}:parked") == 0


async def test_starts_of_one_loop_turn_share_few_calls(
    redis: Redis, unique: str, prefix: str
) -> None:
    """Fifty starts made in one turn of the loop cost two calls (of 32 at most); their ends one."""
    spec = lane_spec(f"guard_{unique}", 1, retry={"tiers": ["1s"]})
    store = GuardStore(redis, prefix, spec.lane, ttl_ms=60_000)
    window = StartWindow(store)

    messages = [Message(spec.name, 0, i, f"k{i}".encode(), b"v") for i in range(50)]
    decisions = await asyncio.gather(*(window.begin(start_of(m, ordered=True)) for m in messages))
    assert decisions == [("process", 1)] * 50
    assert window.calls == 2
    for m in messages:
        window.ended(start_of(m, ordered=True))
    await window.flush()
    assert window.calls == 3
    assert await redis.hlen(store.keys.run) == 0
    # A start of an unfinished copy read again at the same place is a suspect.
    again = await window.begin(start_of(messages[0], ordered=True))
    assert again == ("process", 1)
    assert await window.begin(start_of(messages[0], ordered=True)) == ("suspect", 2)


async def test_a_retry_copy_that_runs_before_its_failed_start_ended_is_not_lost(
    redis: Redis, unique: str, prefix: str
) -> None:
    """The copy of a failure may run before the failing start's end is recorded: it runs."""
    lane = guarded_lane(f"guard_{unique}")
    handlers = Handlers()
    b = member_guard(redis, prefix, lane, handlers, "b")
    copy = retry_copy(lane, 0, 0, b"x")
    copy_outcomes: list[str | None] = []

    class _Racing(Producer):
        async def send(self, topic: str, value: bytes, **kw: object) -> Delivered:
            # The broker hands the copy to another member at once, before A records its end.
            copy_outcomes.append(await b.run(lane, copy))
            return await super().send(topic, value, **kw)

    stats = Stats()
    routing = Redirector(RetryRouter(_Racing()), stats, default_retryable, [lane])  # type: ignore[arg-type]

    async def failing(lane_: Lane, message: Message) -> str | None:
        return await routing.failure(lane_, message, 1, RuntimeError("flaky"))

    a = RunGuard(
        lane_guards(redis, prefix, [lane.spec]),
        routing,
        stats,
        Isolation(5.0),
        failing,
        lambda *_: None,
    )
    assert await a.run(lane, main_message(lane, 0, b"x")) == "retried"
    assert copy_outcomes == ["handled"]
    # The key is not left parked behind a head that already ran: the next message runs.
    assert await b.run(lane, main_message(lane, 1, b"y")) == "handled"
    assert await redis.hlen(f"{{{prefix}:guard:{lane.name}}}:parked") == 0


async def test_a_copy_another_live_member_still_runs_waits_for_its_end(
    redis: Redis, unique: str, prefix: str
) -> None:
    """The same copy read by B while A (alive, only stalled past its partition lease) runs it.

    B must not run it beside A as a suspect: it waits until A's end is recorded, then runs it
    once more (a repeat, which at-least-once allows, never an overlap).
    """
    lane = guarded_lane(f"guard_{unique}")
    handlers = Handlers()
    a, b = (member_guard(redis, prefix, lane, handlers, m) for m in ("a", "b"))
    handlers.hold[b"x"] = asyncio.Event()
    first = asyncio.create_task(a.run(lane, main_message(lane, 0, b"x")))
    await asyncio.wait_for(handlers.started.setdefault(b"x", asyncio.Event()).wait(), 10)
    second = asyncio.create_task(b.run(lane, main_message(lane, 0, b"x")))
    await eventually(lambda: b._stats.busy_waits >= 2)  # asked twice and told to wait
    assert [v for _, v, _, _ in handlers.runs] == []  # nothing ran beside A
    handlers.hold[b"x"].set()
    assert await asyncio.wait_for(first, 10) == "handled"
    await a.flush()  # A's end reaches Redis (at its next call or commit)
    assert await asyncio.wait_for(second, 10) == "handled"
    assert [m for m, _, _, _ in handlers.runs] == ["a", "b"]
    assert handlers.overlaps() == 0


async def test_a_run_left_unrouted_does_not_hold_its_next_copy_back(
    redis: Redis, unique: str, prefix: str
) -> None:
    """A's run ends unrouted (the broker refused its retry copy): it is delivered again later.

    A lives on. B, which reads it next (after a rebalance), runs it at once: A's mark must not
    say A still runs it, or B would wait for A for as long as A lives.
    """
    lane = guarded_lane(f"guard_{unique}")
    handlers = Handlers()
    handlers.outcomes[b"x"] = [None]
    a, b = (member_guard(redis, prefix, lane, handlers, m) for m in ("a", "b"))
    assert await a.run(lane, main_message(lane, 0, b"x")) is None
    await a.flush()
    assert await asyncio.wait_for(b.run(lane, main_message(lane, 0, b"x")), 10) == "handled"
    assert b._stats.busy_waits == 0
    assert [m for m, _, _, _ in handlers.runs] == ["a", "b"]
    assert await redis.hlen(a._stores[lane.name].keys.alone) == 0  # not counted as a crash


async def test_a_copy_of_a_dead_members_start_runs_as_a_suspect(
    redis: Redis, unique: str, prefix: str
) -> None:
    """When the member whose mark stands is no longer alive, the copy is a suspect, as before."""
    lane = guarded_lane(f"guard_{unique}")
    handlers = Handlers()
    a, b = (member_guard(redis, prefix, lane, handlers, m) for m in ("a", "b"))
    handlers.hold[b"x"] = asyncio.Event()
    first = asyncio.create_task(a.run(lane, main_message(lane, 0, b"x")))
    await asyncio.wait_for(handlers.started.setdefault(b"x", asyncio.Event()).wait(), 10)
    first.cancel()  # A dies mid-run: its mark stays; its liveness is taken back, as if it ran out
    await redis.hdel(f"{{{prefix}:guard:{lane.name}}}:live", a._stores[lane.name].instance)
    handlers.hold.pop(b"x").set()
    assert await asyncio.wait_for(b.run(lane, main_message(lane, 0, b"x")), 10) == "handled"
    assert b._stats.busy_waits == 0
    assert [m for m, _, _, _ in handlers.runs] == ["b"]


async def test_a_start_carrying_its_body_is_held_in_the_batched_call(
    redis: Redis, unique: str, prefix: str
) -> None:
    """gd_begin holds a start with a body behind its parked key's head; other starts as before."""
    from pipeline.retry.held import decode_held, encode_held  # noqa: PLC0415

    lane = guarded_lane(f"guard_{unique}")
    store = lane_guards(redis, prefix, [lane.spec])[lane.name]
    window = StartWindow(store)
    head = main_message(lane, 0, b"x")
    started = start_of(head, ordered=True)
    assert await window.begin(started) == ("process", 1)
    await store.route(started, 2, park=True)  # X fails: its key parks behind it

    def with_body(message: Message) -> Start:
        start = start_of(message, ordered=True)
        start.body = encode_held(message)
        return start

    follower, other = main_message(lane, 1, b"y"), main_message(lane, 2, b"z", key=b"other")
    decisions = await asyncio.gather(
        window.begin(with_body(follower)),
        window.begin(with_body(other)),
        window.begin(with_body(retry_copy(lane, 0, 0, b"x"))),
    )
    # Y waits behind X, written once; Z's key is not parked: it runs, its body is not kept;
    # X's own copy is the head, free to run: decided (and marked) in the same call.
    assert decisions == [("held", 0), ("process", 1), ("head", 1)]
    assert window.calls == 2
    held = await redis.hgetall(store.keys.of_key(started.key)[2])
    assert {k.decode(): decode_held(v).value for k, v in held.items()} == {
        start_of(follower, ordered=True).ident: b"y"
    }
    # A second copy of the held follower is not held twice.
    assert await window.begin(with_body(follower)) == ("copy", 0)
    [[release]] = await store.end_many([KeyEnds([(started, "done")], follow_dead=False)])
    assert release.message.value == b"y"


async def test_followers_and_the_head_of_a_parked_key_cost_no_key_call(
    redis: Redis, unique: str, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Held behind the head in the batched start; its copy runs from there and releases them."""
    lane = guarded_lane(f"guard_{unique}")
    handlers = Handlers()
    a = member_guard(redis, prefix, lane, handlers, "a", claims=True)
    messages = [main_message(lane, i, v) for i, v in enumerate([b"x", b"y", b"z"])]
    await a.assigned([messages[0].tp], {})
    await a.extend(messages)
    asked: list[str] = []
    original = GuardStore.begin_parked

    async def counted(self: GuardStore, message: Message, start: Start) -> tuple[Decision, int]:
        asked.append(message.value.decode())
        return await original(self, message, start)

    monkeypatch.setattr(GuardStore, "begin_parked", counted)
    handlers.outcomes[b"x"] = ["retried"]
    assert await a.run(lane, messages[0]) == "retried"
    assert await a.run(lane, messages[1]) == "parked"
    assert await a.run(lane, messages[2]) == "parked"
    assert asked == []  # both held in the batched start call
    assert await a.run(lane, retry_copy(lane, 0, 0, b"x")) == "handled"
    assert [value for _, value, _, _ in handlers.runs] == [b"x", b"x", b"y", b"z"]
    assert asked == []  # the head's copy too was decided in the batched call
    assert await redis.hlen(f"{{{prefix}:guard:{lane.name}}}:parked") == 0


@pytest.mark.parametrize("claimed", [True, False])
async def test_a_routed_first_run_ends_in_the_next_batched_call(
    redis: Redis, unique: str, prefix: str, monkeypatch: pytest.MonkeyPatch, claimed: bool
) -> None:
    """Its route parked the key: its end needs no gd_end_many, its copy still runs as the head."""
    lane = guarded_lane(f"guard_{unique}")
    a, runs = routing_guard(redis, prefix, lane, b"x", claims=claimed)
    store = a._stores[lane.name]
    head, follower = main_message(lane, 0, b"x"), main_message(lane, 1, b"y")
    if claimed:
        await a.assigned([head.tp], {})
        await a.extend([head, follower])
    ended: list[str] = []
    original = GuardStore.end_many

    async def counted(self: GuardStore, groups: Sequence[KeyEnds]) -> list[list[Release]]:
        ended.extend(f"{start.ident} {ending}" for group in groups for start, ending in group.ends)
        return await original(self, groups)

    monkeypatch.setattr(GuardStore, "end_many", counted)
    assert await a.run(lane, head) == "retried"
    assert await a.run(lane, follower) == "parked"
    assert ended == []
    await a.flush()
    # The failed start ended: its mark, of no start now, waits for the copy it produced.
    ident = f"{lane.spec.name}:0:0"
    assert await redis.hgetall(store.keys.run) == {ident.encode(): f"0|{ident}|2".encode()}
    assert await a.run(lane, retry_copy(lane, 0, 0, b"x")) == "handled"
    assert ended == [f"{ident} done", f"{lane.spec.name}:0:1 done"]
    assert runs == [b"x", b"x", b"y"]
    assert await redis.hlen(store.keys.run) == 0
    assert await redis.hlen(f"{{{prefix}:guard:{lane.name}}}:parked") == 0


async def test_heads_coming_due_together_end_in_shared_calls_and_release_in_order(
    redis: Redis, unique: str, prefix: str
) -> None:
    """Ten keys' heads succeed in one turn: their ends share calls, each key's follower follows."""
    lane = guarded_lane(f"guard_{unique}")
    a, runs = routing_guard(redis, prefix, lane, b"x")
    keys = [b"k%d" % i for i in range(10)]
    for i, key in enumerate(keys):
        assert await a.run(lane, main_message(lane, 2 * i, b"x%d" % i, key=key)) == "retried"
        assert await a.run(lane, main_message(lane, 2 * i + 1, b"y%d" % i, key=key)) == "parked"
    runs.clear()
    copies = [retry_copy(lane, 2 * i, i, b"x%d" % i, key=key) for i, key in enumerate(keys)]
    before = a.end_calls
    assert await asyncio.gather(*(a.run(lane, c) for c in copies)) == ["handled"] * 10
    assert a.end_calls - before <= 4  # 20 ends (10 heads, 10 followers) in a few shared calls
    for i in range(10):  # every follower ran, after its own head
        assert runs.index(b"y%d" % i) > runs.index(b"x%d" % i)
    assert sorted(runs) == sorted([b"x%d" % i for i in range(10)] + [b"y%d" % i for i in range(10)])
    assert await redis.hlen(f"{{{prefix}:guard:{lane.name}}}:parked") == 0


async def test_routed_runs_leave_no_trace_in_the_member(
    redis: Redis, unique: str, prefix: str
) -> None:
    """A head's copy that fails again and a released follower that fails: nothing is kept."""
    lane = guarded_lane(f"guard_{unique}")
    a, runs = routing_guard(redis, prefix, lane, b"")  # every main-topic run fails once
    assert await a.run(lane, main_message(lane, 0, b"x")) == "retried"
    assert await a.run(lane, main_message(lane, 1, b"y")) == "parked"
    assert await a.run(lane, retry_copy(lane, 0, 0, b"x")) == "handled"  # releases Y: it fails
    assert runs == [b"x", b"x", b"y"]
    assert a._route_recorded == set()
    assert a._running == {}


async def test_a_copy_waiting_for_a_live_member_stops_when_its_partition_is_revoked(
    redis: Redis, unique: str, prefix: str
) -> None:
    """B waits for A's run of the same copy; B loses the partition meanwhile: B never runs it.

    The partition's next owner runs it (after A's end). B's wait ends with the revocation, not
    with A's run, so B's revocation is not held up by a run of another member.
    """
    lane = guarded_lane(f"guard_{unique}")
    handlers = Handlers()
    a, b = (member_guard(redis, prefix, lane, handlers, m) for m in ("a", "b"))
    tp = TopicPartition(lane.spec.name, 0)
    await b.assigned([tp], {})
    handlers.hold[b"x"] = asyncio.Event()
    first = asyncio.create_task(a.run(lane, main_message(lane, 0, b"x")))
    await asyncio.wait_for(handlers.started.setdefault(b"x", asyncio.Event()).wait(), 10)
    second = asyncio.create_task(b.run(lane, main_message(lane, 0, b"x")))
    await eventually(lambda: b._stats.busy_waits >= 1)
    b.revoked([tp])
    assert await asyncio.wait_for(second, 10) is None  # not run, not routed: left to the next owner
    assert not first.done()  # A still runs it: B did not wait for A's end
    handlers.hold[b"x"].set()
    assert await asyncio.wait_for(first, 10) == "handled"
    assert [m for m, _, _, _ in handlers.runs] == ["a"]


async def test_a_parked_keys_followers_are_released_together_and_end_in_one_call(
    redis: Redis, unique: str, prefix: str
) -> None:
    """Five followers behind a failed head: one call releases them all, one records their ends."""
    lane = guarded_lane(f"guard_{unique}")
    a, runs = routing_guard(redis, prefix, lane, b"x")
    assert await a.run(lane, main_message(lane, 0, b"x")) == "retried"
    followers = [b"y%d" % i for i in range(5)]
    for offset, value in enumerate(followers, start=1):
        assert await a.run(lane, main_message(lane, offset, value)) == "parked"
    before = a.end_calls
    assert await a.run(lane, retry_copy(lane, 0, 0, b"x")) == "handled"
    assert runs == [b"x", b"x", *followers]  # in order, after their head
    assert a.end_calls - before == 2  # the head's end (releasing all five), then their ends
    assert await redis.hlen(f"{{{prefix}:guard:{lane.name}}}:parked") == 0
    assert await redis.hlen(a._stores[lane.name].keys.run) == 0  # every start mark ended


async def test_a_follower_failing_mid_release_holds_back_the_rest_unstarted(
    redis: Redis, unique: str, prefix: str
) -> None:
    """Y2 of a release fails: Y3 does not run, waits behind it unmarked, and runs after its copy."""
    lane = guarded_lane(f"guard_{unique}")
    a, runs = routing_guard(redis, prefix, lane, b"f")  # main-topic runs of f... fail once
    store = a._stores[lane.name]
    assert await a.run(lane, main_message(lane, 0, b"fx")) == "retried"
    for offset, value in enumerate([b"y1", b"fy2", b"y3"], start=1):
        assert await a.run(lane, main_message(lane, offset, value)) == "parked"
    assert await a.run(lane, retry_copy(lane, 0, 0, b"fx")) == "handled"
    assert runs == [b"fx", b"fx", b"y1", b"fy2"]  # Y3 was released with them but did not run
    y3 = f"{lane.spec.name}:0:3"
    assert await redis.hget(store.keys.run, y3) is None  # not counted as started
    assert await redis.hlen(f"{{{prefix}:guard:{lane.name}}}:parked") == 1  # Y2 heads the key
    assert await a.run(lane, main_message(lane, 4, b"y4")) == "parked"  # still behind Y2
    assert await a.run(lane, retry_copy(lane, 2, 1, b"fy2")) == "handled"
    assert runs == [b"fx", b"fx", b"y1", b"fy2", b"fy2", b"y3", b"y4"]
    assert await redis.hlen(f"{{{prefix}:guard:{lane.name}}}:parked") == 0
    assert await redis.hlen(store.keys.run) == 0


async def test_released_followers_that_ran_are_recorded_at_each_checkpoint(
    redis: Redis, unique: str, prefix: str
) -> None:
    """With a checkpoint of 0 s every follower's end is recorded before the next one runs."""
    lane = guarded_lane(f"guard_{unique}")
    a, runs = routing_guard(redis, prefix, lane, b"x")
    a._checkpoint_s = 0.0
    assert await a.run(lane, main_message(lane, 0, b"x")) == "retried"
    for offset in range(1, 4):
        assert await a.run(lane, main_message(lane, offset, b"y%d" % offset)) == "parked"
    before = a.end_calls
    assert await a.run(lane, retry_copy(lane, 0, 0, b"x")) == "handled"
    assert runs == [b"x", b"x", b"y1", b"y2", b"y3"]
    assert a.end_calls - before == 4  # the head's, then one per follower
    assert await redis.hlen(a._stores[lane.name].keys.run) == 0


async def _marks_of_a_dead_member(
    redis: Redis, prefix: str, lane: Lane, handlers: Handlers, messages: list[Message]
) -> None:
    """Member A dies while it runs ``messages``: their start marks stand, and A is not alive."""
    a = member_guard(redis, prefix, lane, handlers, "a")
    for m in messages:
        handlers.hold[m.value] = asyncio.Event()
    dying = [asyncio.create_task(a.run(lane, m)) for m in messages]
    for m in messages:
        await asyncio.wait_for(handlers.started.setdefault(m.value, asyncio.Event()).wait(), 10)
    for task in dying:
        task.cancel()
    await asyncio.gather(*dying, return_exceptions=True)
    await redis.hdel(f"{{{prefix}:guard:{lane.name}}}:live", a._stores[lane.name].instance)
    for m in messages:
        handlers.hold.pop(m.value).set()
    handlers.started.clear()


async def test_a_suspects_end_is_in_redis_before_another_run_starts(
    redis: Redis, unique: str, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two suspects of one member: neither starts until the other's end is recorded.

    Were the gate to open first, a crash in the second one (a poison message) would leave the
    first one's mark standing, and that innocent message would count the crash as one of its
    own lone interruptions, on its way to the dead-letter topic as poison.
    """
    lane = guarded_lane(f"guard_{unique}")
    handlers = Handlers()
    messages = [main_message(lane, i, v, key=b"k" + v) for i, v in enumerate((b"x", b"y"))]
    await _marks_of_a_dead_member(redis, prefix, lane, handlers, messages)
    isolation = Isolation(30.0)
    b = member_guard(redis, prefix, lane, handlers, "b", isolation=isolation)
    store = b._stores[lane.name]
    real = store.begin_many
    ends_of = {f"{lane.spec.name}:0:{m.offset}\t": m.value for m in messages}
    overtaken: list[bytes] = []

    async def ends_held(ended: Sequence[str], starts: Sequence[Start]) -> list[Decided]:
        """Hold a suspect's end back: the other suspect, if it has not run, must not start."""
        for value in (ends_of[line] for line in ended if line in ends_of and not starts):
            started = handlers.started.setdefault(b"y" if value == b"x" else b"x", asyncio.Event())
            if not started.is_set():
                with contextlib.suppress(TimeoutError):  # it must not start: waits in vain
                    await asyncio.wait_for(started.wait(), 1.0)
                if started.is_set():
                    overtaken.append(value)
        return await real(ended, starts)

    monkeypatch.setattr(store, "begin_many", ends_held)
    outcomes = await asyncio.gather(*(b.run(lane, m) for m in messages))
    assert outcomes == ["handled", "handled"]
    assert isolation.suspects == 0
    assert overtaken == []
    assert await redis.hlen(store.keys.run) == 0


def _first_start_of_a_lane_without_parking(
    redis: Redis, prefix: str, unique: str
) -> tuple[TopicSpec, GuardStore, StartWindow, Start]:
    """A lane with one tier and no ordering, its guard, and the start of its offset 7."""
    spec = lane_spec(f"guard_{unique}", 1, retry={"tiers": ["1s"]})
    store = GuardStore(redis, prefix, spec.lane, ttl_ms=60_000)
    first = Message(spec.name, 0, 7, b"k", b"v")
    return spec, store, StartWindow(store), start_of(first, ordered=False)


def _its_copy_in_the_tier(spec: TopicSpec) -> Start:
    """The start of offset 7's copy in the tier, as attempt 2."""
    origin = {h.ORIGIN_TOPIC: spec.name.encode(), h.ORIGIN_PARTITION: b"0", h.ORIGIN_OFFSET: b"7"}
    copy = Message(f"{spec.name}.retry.1s", 0, 0, b"k", b"v", {**origin, h.ATTEMPT: b"2"})
    return start_of(copy, ordered=False)


async def test_a_retried_suspects_lone_count_ends_with_its_copy(
    redis: Redis, unique: str, prefix: str
) -> None:
    """A suspect that fails goes to a tier; its copy takes the mark over and ends: no count left.

    Otherwise the lone count outlived the message (the lane's hashes are kept alive while it
    runs), and a later delivery of it that crashed would start nearer ``poison_after``.
    """
    spec, store, window, start = _first_start_of_a_lane_without_parking(redis, prefix, unique)
    assert await window.begin(start) == ("process", 1)
    # Its member died mid-run: read again, it is a suspect and runs alone once.
    assert await window.begin(start) == ("suspect", 2)
    assert await store.solo(start, poison_after=3) == ("process", 1)
    assert await store.route(start, 2, park=False)  # it failed: its copy goes to the tier
    copied = _its_copy_in_the_tier(spec)
    assert await window.begin(copied) == ("process", 1)  # the copy takes the mark over
    window.ended(start)  # the suspect's own end comes after: the mark is the copy's now
    window.ended(copied)
    await window.flush()
    assert await redis.hlen(store.keys.run) == 0
    assert await redis.hlen(store.keys.alone) == 0


@pytest.mark.parametrize("first", ["first run", "suspect"])
async def test_a_failed_start_delivered_again_leaves_the_run_to_its_retry_copy(
    redis: Redis, unique: str, prefix: str, first: str
) -> None:
    """X failed and went to a tier, its end recorded; its main copy is then delivered again.

    That happens when its offset was not committed yet and its partition moved, even back to
    the same member: the next owner reads from the last commit (on Redis Streams it reclaims
    the entries not yet acknowledged, handled or not). The copy in the tier is the one to run.
    Were the main copy to take the start mark instead and its member die before running it,
    the tier copy would be dropped as a copy of a running start while the main offset, done
    since the failure, is committed: X and every follower held behind it lost.
    """
    lane = guarded_lane(f"guard_{unique}")
    handlers = Handlers()
    x = main_message(lane, 0, b"x")
    if first == "suspect":  # an earlier start of X never ended: X ran alone, then failed
        await _marks_of_a_dead_member(redis, prefix, lane, handlers, [x])
    a, runs = routing_guard(redis, prefix, lane, b"x")
    assert await a.run(lane, x) == "retried"
    await a.flush()  # its end is recorded (at its next call or commit)
    y = main_message(lane, 1, b"y")
    b = member_guard(redis, prefix, lane, handlers, "b")
    assert await b.run(lane, y) == "parked"  # held behind X
    # The main copy of X again, at B: it must neither run nor stand in its retry copy's way.
    handlers.hold[b"x"] = asyncio.Event()
    again = asyncio.create_task(b.run(lane, x))
    started = asyncio.create_task(handlers.started.setdefault(b"x", asyncio.Event()).wait())
    await asyncio.wait({again, started}, timeout=10, return_when=asyncio.FIRST_COMPLETED)
    started.cancel()
    assert again.done(), "the main copy delivered again was taken for its key's head"
    assert again.result() == "duplicate"
    handlers.hold.pop(b"x").set()
    c = member_guard(redis, prefix, lane, handlers, "c")
    assert await c.run(lane, retry_copy(lane, 0, 0, b"x")) == "handled"
    assert runs == [b"x"]
    assert [(m, v) for m, v, _, _ in handlers.runs if m != "a"] == [("c", b"x"), ("c", b"y")]
    assert await redis.hlen(a._stores[lane.name].keys.run) == 0
    assert await redis.hlen(f"{{{prefix}:guard:{lane.name}}}:parked") == 0


@pytest.mark.parametrize("produced", [True, False])
async def test_a_routed_start_that_ended_leaves_its_mark_to_the_copy_it_produced(
    redis: Redis, unique: str, prefix: str, produced: bool
) -> None:
    """A failed copy delivered again is stale once its retry copy was produced (no parking).

    If producing failed, that copy never comes, and the failed one runs again.
    """
    spec, store, window, start = _first_start_of_a_lane_without_parking(redis, prefix, unique)
    assert await window.begin(start) == ("process", 1)
    assert await store.route(start, 2, park=False)
    window.ended(start, routed=produced)
    again = await window.begin(start)
    if not produced:
        assert again == ("process", 1)
        return
    assert again == ("copy", 0)
    copied = _its_copy_in_the_tier(spec)
    assert await window.begin(copied) == ("process", 1)
    assert await window.begin(start) == ("copy", 1)  # the copy runs now: the failed one waits
    window.ended(copied)
    await window.flush()
    assert await redis.hlen(store.keys.run) == 0


async def test_a_heads_copy_another_live_member_runs_waits_and_is_then_stale(
    redis: Redis, unique: str, prefix: str
) -> None:
    """The head's retry copy, started at A, is read again by B while A still has it to run.

    A head's start can wait long before it runs (behind a suspect run alone), and a revoked
    partition's running work goes on while its next owner reads what was not committed. B
    must wait for A, not run it beside A as a suspect, and not at all once A ran it: the key's
    followers run after it.
    """
    lane = guarded_lane(f"guard_{unique}")
    handlers = Handlers()
    a, b = (member_guard(redis, prefix, lane, handlers, m) for m in ("a", "b"))
    handlers.outcomes[b"x"] = ["retried"]
    assert await a.run(lane, main_message(lane, 0, b"x")) == "retried"
    assert await a.run(lane, main_message(lane, 1, b"y")) == "parked"
    handlers.started.pop(b"x")
    handlers.hold[b"x"] = asyncio.Event()
    copy = retry_copy(lane, 0, 0, b"x")
    first = asyncio.create_task(a.run(lane, copy))
    await asyncio.wait_for(handlers.started.setdefault(b"x", asyncio.Event()).wait(), 10)
    second = asyncio.create_task(b.run(lane, copy))
    await eventually(lambda: b._stats.busy_waits >= 2)  # asked twice and told to wait
    assert [v for m, v, _, _ in handlers.runs if m == "b"] == []
    handlers.hold.pop(b"x").set()
    assert await asyncio.wait_for(first, 10) == "handled"
    assert await asyncio.wait_for(second, 10) == "duplicate"
    assert [(m, v) for m, v, _, _ in handlers.runs] == [("a", b"x"), ("a", b"x"), ("a", b"y")]
    assert handlers.overlaps() == 0


async def test_each_decision_is_one_debug_line_of_its_own_logger(
    redis: Redis, unique: str, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    """``pipeline.guard.decisions`` at DEBUG says which copy of which message went which way."""
    caplog.set_level(logging.DEBUG, logger="pipeline.guard.decisions")
    lane = guarded_lane(f"guard_{unique}")
    a, _ = routing_guard(redis, prefix, lane, b"x")
    x = main_message(lane, 0, b"x")
    assert await a.run(lane, x) == "retried"
    await a.flush()
    assert await a.run(lane, x) == "duplicate"  # read again: its retry copy runs instead
    assert await a.run(lane, retry_copy(lane, 0, 0, b"x")) == "handled"
    ident = f"{lane.spec.name}:0:0"
    lines = [r.getMessage() for r in caplog.records if r.name == "pipeline.guard.decisions"]
    assert [line.split("): ", 1)[1] for line in lines] == [
        "process",
        "slow, 0 starts",
        "its parked key says copy, 0 starts",
        "head, 1 starts",
    ]
    assert lines[0].startswith(f"{lane.name}: {ident} read at {ident} (attempt 1, key ")
    assert f"read at {lane.routes.retry_topics[0]}:0:0 (attempt 2" in lines[-1]


async def test_a_released_suspect_waiting_for_its_lone_turn_is_not_started_again_by_a_reread(
    redis: Redis, unique: str, prefix: str
) -> None:
    """A re-read of a released suspect waiting for its lone turn counts no start against it.

    Y, released as a suspect, waits for the member's other runs to end; Y read again meanwhile
    is a duplicate of it: it does not run, and Redis counts no second start of Y (which would
    bring Y one interruption closer to the dead-letter topic as poison).
    """
    lane = guarded_lane(f"guard_{unique}")
    handlers = Handlers()
    isolation = Isolation(30.0)
    a = member_guard(redis, prefix, lane, handlers, "a")
    b = member_guard(redis, prefix, lane, handlers, "b", isolation=isolation)
    store = b._stores[lane.name]
    handlers.outcomes[b"x"] = ["retried"]
    await a.run(lane, main_message(lane, 0, b"x"))
    await a.run(lane, main_message(lane, 1, b"y"))
    handlers.hold[b"y"] = asyncio.Event()
    dying = asyncio.create_task(a.run(lane, retry_copy(lane, 0, 0, b"x")))
    await asyncio.wait_for(handlers.started.setdefault(b"y", asyncio.Event()).wait(), 10)
    dying.cancel()  # A dies running its released Y: Y's start mark stands
    with pytest.raises(asyncio.CancelledError):
        await dying
    handlers.hold.pop(b"y").set()
    y = f"{lane.spec.name}:0:1"

    await isolation.enter_shared()  # a run of another key is in progress in B
    try:

        async def taken_over() -> None:
            while not isolation.suspects:  # B took A's release over: Y waits for its lone turn
                await b.tick({lane.name: lane})
                await asyncio.sleep(0.05)

        await asyncio.wait_for(taken_over(), 20)
        marked = await redis.hget(store.keys.run, y)  # the released suspect's start, counted
        again = await asyncio.wait_for(b.run(lane, main_message(lane, 1, b"y")), 10)
        assert again == "duplicate"
        assert await redis.hget(store.keys.run, y) == marked  # no start counted
    finally:
        isolation.leave_shared()
    await eventually(lambda: not b._reaped)
    assert [(m, v) for m, v, _, _ in handlers.runs] == [("a", b"x"), ("a", b"x"), ("b", b"y")]
    assert await redis.hlen(store.keys.run) == 0


async def test_a_heads_run_another_member_took_over_while_stalled_releases_nothing(
    redis: Redis, unique: str, prefix: str
) -> None:
    """A head's end from a member that stalled while another ran the head again releases nothing.

    A runs a parked key's head from its tier and stalls past its liveness; B, reading the same
    copy, runs it as a suspect and releases the followers. A's end, when A resumes, is stale:
    it releases nothing, so Y and Z run once, on B.

    Before, A's end released the follower B was running to A as a suspect (the freeze loop's
    overlaps on Kafka: ``released: suspect`` on the resumed member beside ``released:
    process`` on the other).
    """
    lane = guarded_lane(f"guard_{unique}")
    handlers = Handlers()
    a, b = (member_guard(redis, prefix, lane, handlers, m) for m in ("a", "b"))
    handlers.outcomes[b"x"] = ["retried"]
    await a.run(lane, main_message(lane, 0, b"x"))
    for offset, value in ((1, b"y"), (2, b"z")):
        assert await a.run(lane, main_message(lane, offset, value)) == "parked"
    handlers.hold[b"x"] = asyncio.Event()
    copy = retry_copy(lane, 0, 0, b"x")
    stalled = asyncio.create_task(a.run(lane, copy))  # the head, from its tier
    await asyncio.wait_for(handlers.started.setdefault(b"x", asyncio.Event()).wait(), 10)
    store = a._stores[lane.name]
    await redis.hdel(store.keys.live, store.instance)  # A stalled: its liveness ran out
    handlers.started.pop(b"x")
    held_x = handlers.hold.pop(b"x")
    handlers.hold[b"y"] = asyncio.Event()
    took_over = asyncio.create_task(b.run(lane, copy))  # B reads the copy again: a suspect
    await asyncio.wait_for(handlers.started.setdefault(b"y", asyncio.Event()).wait(), 10)
    handlers.started.pop(b"y")
    again = handlers.started.setdefault(b"y", asyncio.Event())  # set if Y starts once more
    held_x.set()  # A resumes while B runs the follower it released
    await eventually(lambda: stalled.done() or again.is_set())
    handlers.hold.pop(b"y").set()
    assert await asyncio.wait_for(stalled, 10) == "handled"
    assert await asyncio.wait_for(took_over, 10) == "handled"
    runs = [(m, v) for m, v, _, _ in handlers.runs]
    assert [r for r in runs if r[0] == "a"] == [("a", b"x"), ("a", b"x")]
    assert [r for r in runs if r[0] == "b"] == [("b", b"x"), ("b", b"y"), ("b", b"z")]
    assert await redis.hlen(f"{{{prefix}:guard:{lane.name}}}:parked") == 0


async def test_a_member_whose_release_was_taken_over_while_stalled_releases_nothing_more(
    redis: Redis, unique: str, prefix: str
) -> None:
    """A stalls mid-release; its lease lapses and B takes the release over. A, back, stops.

    A's follower that was running ends as handled, but A gets no further followers and does
    not undo the marks of those B runs: Z and W run once, on B, after Y.
    """
    lane = guarded_lane(f"guard_{unique}")
    handlers = Handlers()
    a, b = (member_guard(redis, prefix, lane, handlers, m) for m in ("a", "b"))
    a._checkpoint_s = 0.0  # A records each follower's end before the next (it was stalled)
    handlers.outcomes[b"x"] = ["retried"]
    await a.run(lane, main_message(lane, 0, b"x"))
    for offset, value in ((1, b"y"), (2, b"z"), (3, b"w")):
        assert await a.run(lane, main_message(lane, offset, value)) == "parked"
    handlers.hold[b"y"] = asyncio.Event()
    resumed = asyncio.create_task(a.run(lane, retry_copy(lane, 0, 0, b"x")))
    await asyncio.wait_for(handlers.started.setdefault(b"y", asyncio.Event()).wait(), 10)
    store = a._stores[lane.name]
    key = (await redis.zrange(store.keys.releases, 0, -1))[0]
    await redis.zadd(store.keys.releases, {key: 0})  # A stalled: its lease ran out
    handlers.started.pop(b"y")
    await b.tick({lane.name: lane})  # B takes the release over: Y again (a suspect of A's)
    await asyncio.wait_for(handlers.started.setdefault(b"y", asyncio.Event()).wait(), 10)
    handlers.hold.pop(b"y").set()  # A resumes; both runs of Y end
    assert await asyncio.wait_for(resumed, 10) == "handled"
    await eventually(lambda: not b._reaped)
    runs = [(m, v) for m, v, _, _ in handlers.runs]
    assert [r for r in runs if r[0] == "a"] == [("a", b"x"), ("a", b"x"), ("a", b"y")]
    assert [r for r in runs if r[0] == "b"] == [("b", b"y"), ("b", b"z"), ("b", b"w")]
    assert await redis.hlen(f"{{{prefix}:guard:{lane.name}}}:parked") == 0


@pytest.mark.parametrize("claims", [False, True], ids=["marked", "claimed"])
async def test_a_start_that_waited_at_the_gate_while_its_partition_left_does_not_run(
    redis: Redis, unique: str, prefix: str, claims: bool
) -> None:
    """A run waiting for a suspect's lone turn to end, its partition revoked meanwhile, stays out.

    Its member let the revocation's grace pass with it still waiting and gave its claim up, so
    the partition's next owner runs it without waiting: run here after that, it would run beside
    that owner's run of it or of its key's next messages (the crash loop on Redis Streams caught
    a run like it). It is left for redelivery instead, with no mark of its own left standing.
    """
    lane = guarded_lane(f"guard_{unique}")
    handlers = Handlers()
    isolation = Isolation(30.0)
    b = member_guard(redis, prefix, lane, handlers, "b", claims=claims, isolation=isolation)
    message = main_message(lane, 3, b"late")
    await b.assigned([message.tp], {})
    lone = isolation.alone()
    await lone.__aenter__()  # a suspect runs alone: ordinary runs wait at the gate
    run = asyncio.create_task(b.run(lane, message))
    await eventually(lambda: isolation.waiting == 1)
    b.revoked([message.tp])  # the revocation's grace ran out with the run still waiting
    await lone.__aexit__(None, None, None)
    assert await run is None
    assert handlers.runs == []
    await b.flush()
    assert await redis.hlen(b._stores[lane.name].keys.run) == 0
