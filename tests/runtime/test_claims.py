"""Claimed ranges on real Redis: fast first deliveries, and nothing the exact path promised lost.

Members are run guards built as in ``test_guard.py``. A member "crashes" by having its running
task cancelled and its liveness deleted, which is what another process sees once a dead
process's liveness has run out.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence

import pytest
from redis import exceptions as rexc
from redis.asyncio import Redis
from runtime.guard_parts import (
    Handlers,
    guarded_lane,
    main_message,
    member_guard,
    retry_copy,
    routing_guard,
)
from runtime.helpers import FAST, declare, eventually, join, lane_spec, partition_0, running

from pipeline.envelope import Message, Position, TopicPartition
from pipeline.retry.guard_store import GuardStore, KeyEnds, Release, Start, lane_guards
from pipeline.retry.keys import encode_key
from pipeline.runtime import App, Context
from pipeline.runtime import claims as claims_module
from pipeline.runtime.app import Lane
from pipeline.runtime.claims import LaneClaims
from pipeline.runtime.guard import RunGuard
from pipeline.runtime.isolation import Isolation
from pipeline.runtime.member import Member
from pipeline.transport.protocol import Transport


async def _one_member(
    redis: Redis, prefix: str, lane: Lane
) -> tuple[RunGuard, GuardStore, str, LaneClaims]:
    """One member that holds the lane's partition: its guard, store, claims key and claims."""
    guard = member_guard(redis, prefix, lane, Handlers(), "a", claims=True)
    await join(guard, lane, [main_message(lane, 0, b"x")])
    store = guard._stores[lane.name]
    return guard, store, store.keys.claims(lane.spec.name, 0), guard._claims[lane.name]


async def _started(
    guard: RunGuard, lane: Lane, handlers: Handlers, message: Message
) -> asyncio.Task[str | None]:
    """A new owner joins and runs ``message`` until its handler has started (and holds)."""
    await join(guard, lane, [message])
    handlers.started.pop(message.value, None)
    task = asyncio.create_task(guard.run(lane, message))
    await asyncio.wait_for(handlers.started.setdefault(message.value, asyncio.Event()).wait(), 10)
    return task


async def _crash(guard: RunGuard, lane: Lane, redis: Redis, task: asyncio.Task[object]) -> None:
    """The member dies while ``task`` runs: the run stops and its liveness is gone."""
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    store = guard._stores[lane.name]
    await redis.hdel(store.keys.live, store.instance)


class HeldClaims:
    """The store's claim writes, held on their way to Redis until the test lets them go."""

    def __init__(self, store: GuardStore, monkeypatch: pytest.MonkeyPatch) -> None:
        """Hold ``store``'s writes from :meth:`hold` on, until ``go`` is set."""
        self._store = store
        self._monkeypatch = monkeypatch
        self.real = store.claim
        self.sent = asyncio.Event()
        self.go = asyncio.Event()
        self.writes: list[dict[TopicPartition, tuple[int, int]]] = []

    async def _held(self, ranges: dict[TopicPartition, tuple[int, int]]) -> set[TopicPartition]:
        self.writes.append(dict(ranges))
        self.sent.set()
        await self.go.wait()  # Redis answers only when the test says so
        return await self.real(ranges)

    def hold(self) -> None:
        """Writes from now on wait for ``go``."""
        self._monkeypatch.setattr(self._store, "claim", self._held)

    def pass_through(self) -> None:
        """Writes from now on go to Redis at once."""
        self._monkeypatch.setattr(self._store, "claim", self.real)


async def test_first_deliveries_under_a_claim_make_no_call(
    redis: Redis, unique: str, prefix: str
) -> None:
    """Fifty first deliveries run with no start mark; one claim covers them, given up at the end."""
    lane = guarded_lane(f"claims_{unique}")
    handlers = Handlers()
    guard = member_guard(redis, prefix, lane, handlers, "a", claims=True)
    messages = [main_message(lane, i, b"v%d" % i, key=b"k%d" % i) for i in range(50)]
    await join(guard, lane, messages)
    outcomes = await asyncio.gather(*(guard.run(lane, m) for m in messages))
    assert outcomes == ["handled"] * 50
    assert guard.calls == 0
    store = guard._stores[lane.name]
    claims_key = store.keys.claims(lane.spec.name, 0)
    lo, hi = (int(x) for x in (await redis.hget(claims_key, store.instance)).split(b"|"))
    assert lo == 0
    assert hi >= 49
    assert await redis.hlen(store.keys.run) == 0  # no marks to end
    await guard.give_up(guard.revoked([partition_0(lane)]))
    assert await redis.hlen(claims_key) == 0


async def test_a_crash_on_a_claimed_message_is_caught_one_owner_later(
    redis: Redis, unique: str, prefix: str
) -> None:
    """Crash under A's claim, then under B's exact run of it: C runs it alone as a suspect."""
    lane = guarded_lane(f"claims_{unique}")
    handlers = Handlers()
    poison = main_message(lane, 3, b"poison")
    handlers.hold[b"poison"] = asyncio.Event()  # never set: every run of it dies in the handler
    a = member_guard(redis, prefix, lane, handlers, "a", claims=True)
    run_a = await _started(a, lane, handlers, poison)
    assert a.calls == 0  # it ran under the claim
    await _crash(a, lane, redis, run_a)

    lone_b = Isolation(5.0)
    b = member_guard(redis, prefix, lane, handlers, "b", claims=True, isolation=lone_b)
    run_b = await _started(b, lane, handlers, poison)
    assert b.calls == 1  # inherited from A: marked before it ran
    store = b._stores[lane.name]
    ident = f"{lane.spec.name}:0:3"
    # A died with it claimed: it may have been running, so its mark says two starts. It ran
    # beside others, if at all, so nothing counts towards poison_after yet: a neighbour that
    # A's crash cut short is not one crash nearer the dead-letter topic for it.
    assert lone_b.suspects == 0
    assert (await redis.hget(store.keys.run, ident)).startswith(b"2|")
    assert await redis.hget(store.keys.alone, ident) is None
    await _crash(b, lane, redis, run_b)

    isolation = Isolation(5.0)
    c = member_guard(redis, prefix, lane, handlers, "c", claims=True, isolation=isolation)
    run_c = await _started(c, lane, handlers, poison)
    assert isolation.suspects == 1  # B's unfinished mark: C runs it alone
    assert await redis.hget(store.keys.alone, ident) == b"1"  # its first lone start
    handlers.hold[b"poison"].set()
    assert await asyncio.wait_for(run_c, 10) == "handled"


async def _waiting_for_a(
    redis: Redis, prefix: str, lane: Lane, handlers: Handlers, message: Message
) -> tuple[RunGuard, RunGuard, asyncio.Task[str | None]]:
    """A claims ``message`` and stays alive; B joins and runs it, waiting (asked twice) for A."""
    a = member_guard(redis, prefix, lane, handlers, "a", claims=True)
    await join(a, lane, [message])  # A claimed it and is alive (assigned() renewed it)
    b = member_guard(redis, prefix, lane, handlers, "b", claims=True)
    await join(b, lane, [message])
    asked = 0
    store_b = b._stores[lane.name]
    claiming = store_b.claiming

    async def counted(tp: TopicPartition, instances: list[str]) -> tuple[list[str], list[str]]:
        nonlocal asked
        asked += 1
        return await claiming(tp, instances)

    store_b.claiming = counted  # type: ignore[method-assign]
    run_b = asyncio.create_task(b.run(lane, message))
    await eventually(lambda: asked >= 2)
    return a, b, run_b


async def test_a_live_previous_owner_is_waited_for_until_it_gives_up(
    redis: Redis, unique: str, prefix: str
) -> None:
    """A stalled, still-alive A keeps its claim: B's copy of A's range waits, then runs once."""
    lane = guarded_lane(f"claims_{unique}")
    handlers = Handlers()
    message = main_message(lane, 2, b"x")
    a, _, run_b = await _waiting_for_a(redis, prefix, lane, handlers, message)
    assert not run_b.done()
    assert handlers.runs == []
    await a.give_up(a.revoked([partition_0(lane)]))  # A's revocation ended its work here
    assert await asyncio.wait_for(run_b, 10) == "handled"
    assert [(m, v) for m, v, _, _ in handlers.runs] == [("b", b"x")]


async def test_a_run_waiting_for_a_previous_owner_does_not_start_once_revoked(
    redis: Redis, unique: str, prefix: str
) -> None:
    """B waits for live A; B loses the partition meanwhile: its run never starts, C's does.

    Had it started, it would run beside the partition's next owner: B gives its claim up at
    the revocation, so C finds nothing to wait for and runs the message too.
    """
    lane = guarded_lane(f"claims_{unique}")
    handlers = Handlers()
    message = main_message(lane, 2, b"x")
    a, b, run_b = await _waiting_for_a(redis, prefix, lane, handlers, message)
    await b.give_up(b.revoked([partition_0(lane)]))  # B loses the partition while it waits
    await a.give_up(a.revoked([partition_0(lane)]))
    assert await asyncio.wait_for(run_b, 10) is None  # not run: delivered again to the owner
    c = member_guard(redis, prefix, lane, handlers, "c", claims=True)
    await join(c, lane, [message])
    assert await asyncio.wait_for(c.run(lane, message), 10) == "handled"
    assert [(m, v) for m, v, _, _ in handlers.runs] == [("c", b"x")]


async def test_a_claim_whose_deletion_failed_is_deleted_at_the_next_tick(
    redis: Redis, unique: str, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A gives its claim up while Redis fails the deletion: A's next tick deletes it.

    Left in place, the partition's next owner would wait for A for as long as A lives.
    """
    lane = guarded_lane(f"claims_{unique}")
    a, store, key, claims = await _one_member(redis, prefix, lane)
    real_unclaim = store.unclaim

    async def unreachable(tps: list[TopicPartition]) -> bool:
        return False  # as GuardStore.unclaim answers when Redis fails (and logs it)

    monkeypatch.setattr(store, "unclaim", unreachable)
    await a.give_up(a.revoked([partition_0(lane)]))
    assert await redis.hget(key, store.instance) is not None
    monkeypatch.setattr(store, "unclaim", real_unclaim)
    await claims.keep()
    assert await redis.hget(key, store.instance) is None
    await a.assigned([partition_0(lane)], {})  # taken back before a retry: its new claim stays
    monkeypatch.setattr(store, "unclaim", unreachable)
    await a.give_up(a.revoked([partition_0(lane)]))
    await a.assigned([partition_0(lane)], {})
    monkeypatch.setattr(store, "unclaim", real_unclaim)
    await claims.keep()
    assert await redis.hget(key, store.instance) == b"0|99"


async def test_keys_parked_before_or_here_take_the_exact_path(
    redis: Redis, unique: str, prefix: str
) -> None:
    """A key parked by this member, or found parked at assignment, holds its next messages."""
    lane = guarded_lane(f"claims_{unique}")
    handlers = Handlers()
    handlers.outcomes[b"x"] = ["retried"]  # X fails once: its key parks
    a = member_guard(redis, prefix, lane, handlers, "a", claims=True)
    first = [main_message(lane, 0, b"x"), main_message(lane, 1, b"y")]
    await join(a, lane, first)
    assert await a.run(lane, first[0]) == "retried"
    assert a.calls == 0  # X itself ran under the claim
    assert await a.run(lane, first[1]) == "parked"  # Y: its key parked here, so asked and held
    await a.give_up(a.revoked([partition_0(lane)]))

    b = member_guard(redis, prefix, lane, handlers, "b", claims=True)
    later = [main_message(lane, 2, b"z")]
    await join(b, lane, later)  # the key was parked when the partition came here
    assert await b.run(lane, later[0]) == "parked"
    other = main_message(lane, 3, b"w", key=b"other")
    await b.extend([other])
    assert await b.run(lane, other) == "handled"
    claims = b._claims[lane.name]
    assert claims.maybe_parked == {encode_key(b"k")}


async def test_a_quiet_partitions_claim_is_written_again_at_every_tick(
    redis: Redis, unique: str, prefix: str
) -> None:
    """Nothing polled: the member's tick still writes the claim, and its expiry starts again."""
    lane = guarded_lane(f"claims_{unique}")
    _, store, key, claims = await _one_member(redis, prefix, lane)
    assert store.ttl_ms > 60_000
    await redis.pexpire(key, 60_000)  # as if written a while ago
    await claims.keep()
    assert await redis.pttl(key) > 60_000
    assert await redis.hget(key, store.instance) == b"0|99"


async def test_a_claim_written_while_its_partition_is_revoked_is_not_left_behind(
    redis: Redis, unique: str, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rebalance revokes the partition while a claim is being extended: nothing stays claimed.

    Otherwise the next owner waits for this live process, which renews the claim for ever.
    Then the same race with the partition assigned back: the new assignment's claim stays.
    """
    lane = guarded_lane(f"claims_{unique}")
    guard, store, key, claims = await _one_member(redis, prefix, lane)
    held = HeldClaims(store, monkeypatch)  # the rebalance runs while a write is on its way
    for assign_back in (False, True):
        held.sent.clear()
        held.go.clear()
        if assign_back:
            await join(guard, lane, [main_message(lane, 0, b"x")])
        held.hold()
        far = main_message(lane, 500, b"far")
        extending = asyncio.create_task(guard.extend([far]))
        await asyncio.wait_for(held.sent.wait(), 10)
        await guard.give_up(guard.revoked([partition_0(lane)]))
        if assign_back:
            held.pass_through()
            await guard.assigned([partition_0(lane)], {})
            held.hold()
        held.go.set()
        await extending
        held.pass_through()
        await claims.keep()
        value = await redis.hget(key, store.instance)
        if assign_back:
            assert value == b"0|99"  # the new assignment's claim, not the extended one
            assert claims.unmarked(main_message(lane, 99, b"y", key=b"y")) is not None
            assert claims.unmarked(far) is None
        else:
            assert value is None
            assert claims._claimed == {}


async def test_keys_parked_since_the_first_assignment_are_known_at_the_next(
    redis: Redis, unique: str, prefix: str
) -> None:
    """B joined before A parked a key; when A hands its partition over, B holds the follower."""
    lane = guarded_lane(f"claims_{unique}")
    handlers = Handlers()
    b = member_guard(redis, prefix, lane, handlers, "b", claims=True)
    other = TopicPartition(lane.spec.name, 1)
    await b.assigned([other], {})  # B's first assignment: nothing parked yet
    a = member_guard(redis, prefix, lane, handlers, "a", claims=True)
    head, follower = main_message(lane, 0, b"x"), main_message(lane, 1, b"y")
    await join(a, lane, [head])
    handlers.outcomes[b"x"] = ["retried"]
    assert await a.run(lane, head) == "retried"  # A parks the key
    await a.give_up(a.revoked([partition_0(lane)]))  # and hands the partition over cleanly
    await join(b, lane, [follower])
    assert await b.run(lane, follower) == "parked"  # held behind X, not run before it
    assert [value for _, value, _, _ in handlers.runs] == [b"x"]


async def test_a_claim_is_grown_ahead_of_the_batches_without_waiting(
    redis: Redis, unique: str, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch past its claim's middle does not wait: the claim grows while the batch runs.

    Offsets the growth covers run unmarked only once it is written; a batch that reaches past
    the claim meanwhile waits for the growth and then for its own write.
    """
    lane = guarded_lane(f"claims_{unique}")
    guard, store, key, claims = await _one_member(redis, prefix, lane)  # claimed 0|99
    held = HeldClaims(store, monkeypatch)
    writes = held.writes
    held.hold()
    await asyncio.wait_for(guard.extend([main_message(lane, 60, b"mid")]), 10)  # no wait
    await asyncio.wait_for(held.sent.wait(), 10)
    assert writes == [{partition_0(lane): (0, 199)}]
    assert claims.unmarked(main_message(lane, 99, b"in", key=b"in")) is not None
    assert claims.unmarked(main_message(lane, 150, b"grown", key=b"grown")) is None  # not yet
    far = asyncio.create_task(guard.extend([main_message(lane, 250, b"far")]))
    await asyncio.sleep(0)  # far runs up to its first wait
    assert len(writes) == 1  # past the claim, it waits for the growth under way, not beside it
    held.go.set()
    await asyncio.wait_for(far, 10)
    assert writes[-1] == {partition_0(lane): (0, 350)}
    assert await redis.hget(key, store.instance) == b"0|350"
    assert claims.unmarked(main_message(lane, 150, b"grown", key=b"grown")) is not None
    assert claims.unmarked(main_message(lane, 350, b"top", key=b"top")) is not None
    await guard.close()


async def test_a_claim_grown_while_its_partition_is_revoked_is_not_left_behind(
    redis: Redis, unique: str, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The background growth ends after the partition was given up: the claim is deleted."""
    lane = guarded_lane(f"claims_{unique}")
    guard, store, key, claims = await _one_member(redis, prefix, lane)
    held = HeldClaims(store, monkeypatch)
    held.hold()
    await guard.extend([main_message(lane, 60, b"mid")])
    await asyncio.wait_for(held.sent.wait(), 10)
    held.pass_through()
    await guard.give_up(guard.revoked([partition_0(lane)]))
    assert await redis.hget(key, store.instance) is None
    held.go.set()
    await guard.close()  # waits for the growth, which deletes what it wrote
    assert await redis.hget(key, store.instance) is None
    assert claims._claimed == {}


async def _taken_over(
    redis: Redis, prefix: str, lane: Lane, handlers: Handlers
) -> tuple[RunGuard, RunGuard, list[list[TopicPartition]]]:
    """A holds the partition (claimed 0..99); B is assigned it too, from committed offset 50.

    A has not heard of it: its view of the group is stale, as a member's is between a broker
    dropping it from the group and its client finding out. Returns A, B and what A was told.
    """
    told: list[list[TopicPartition]] = []
    a = member_guard(redis, prefix, lane, handlers, "a", claims=True)
    a._claims[lane.name]._on_superseded = told.append
    await join(a, lane, [main_message(lane, 0, b"first")])
    b = member_guard(redis, prefix, lane, handlers, "b", claims=True)
    tp = partition_0(lane)
    await b.assigned([tp], {tp: Position(tp, 50)})
    return a, b, told


async def test_a_process_whose_partition_was_assigned_elsewhere_starts_nothing_more_of_it(
    redis: Redis, unique: str, prefix: str
) -> None:
    """A's claim cannot grow once B took the partition: A starts nothing, B runs what is above.

    Before, A's claim grew past what B found at its assignment, and both ran the offsets above
    it unmarked, two runs of one key at a time.
    """
    lane = guarded_lane(f"claims_{unique}")
    handlers = Handlers()
    a, b, told = await _taken_over(redis, prefix, lane, handlers)
    claims_b = b._claims[lane.name]
    above = main_message(lane, 120, b"above")  # above A's claim: B's own range (100..149)
    assert claims_b.unmarked(above) is not None
    await a.extend([above])  # A polls past its claim: growing it is refused
    assert told == [[partition_0(lane)]]
    assert a._claims[lane.name].superseded(partition_0(lane))
    assert await a.run(lane, above) is None  # not run, not routed: B's now
    within = main_message(lane, 60, b"within", key=b"other")  # A's claim, fetched by A before
    assert await a.run(lane, within) is None
    assert handlers.runs == []
    assert await b.run(lane, above) == "handled"
    assert b.calls == 0  # unmarked: nobody else can start it any more
    await a._claims[lane.name].keep()  # told again until revoked: the rejoin may have failed
    assert told == [[partition_0(lane)], [partition_0(lane)]]
    waiting = asyncio.create_task(b.run(lane, within))  # inherited from A: waits for A
    await b.extend([within])
    await asyncio.sleep(0)
    assert not waiting.done()
    await a.give_up(a.revoked([partition_0(lane)]))  # A's rejoin revokes the partition there
    assert await asyncio.wait_for(waiting, 10) == "handled"
    assert [(m, v) for m, v, _, _ in handlers.runs] == [("b", b"above"), ("b", b"within")]
    await a.close()
    await b.close()


async def test_a_quiet_process_finds_its_partition_taken_over_at_its_next_tick(
    redis: Redis, unique: str, prefix: str
) -> None:
    """Nothing polled since B took the partition: A's tick finds out, and A's claim stays.

    A's claim stays until A gives it up (after its rejoin revoked the partition), since A may
    still run what it started; B waits for it meanwhile. Assigned to A again later, A owns it.
    """
    lane = guarded_lane(f"claims_{unique}")
    handlers = Handlers()
    a, b, told = await _taken_over(redis, prefix, lane, handlers)
    store_a = a._stores[lane.name]
    key = store_a.keys.claims(lane.spec.name, 0)
    await a._claims[lane.name].keep()
    assert told == [[partition_0(lane)]]
    assert await redis.hget(key, store_a.instance) == b"0|99"
    assert await redis.hget(key, "@owner") == b._stores[lane.name].instance.encode()
    await a.give_up(a.revoked([partition_0(lane)]))
    await b.give_up(b.revoked([partition_0(lane)]))
    await a.assigned([partition_0(lane)], {})  # the group gives it back to A
    assert not a._claims[lane.name].superseded(partition_0(lane))
    await a.extend([main_message(lane, 150, b"far")])
    assert await redis.hget(key, store_a.instance) == b"0|250"
    await a._claims[lane.name].keep()
    assert told == [[partition_0(lane)]]
    await a.close()
    await b.close()


async def test_a_member_whose_partition_another_process_took_rejoins_and_carries_on(
    transport: Transport, redis: Redis, prefix: str, unique: str
) -> None:
    """Another process takes a partition the member holds: the member rejoins and owns it again.

    The group still says the partition is the member's (the other process's view was the stale
    one): after its rejoin the member takes its claim back, the other process's next write is
    refused, and the member handles what comes next, once.
    """
    spec = lane_spec(f"taken_{unique}", 1, retry={"tiers": ["1s"]})
    await declare(transport, spec)
    app = App([spec])
    handled: list[bytes] = []

    @app.handler(spec.lane)
    async def handle(event: Message, ctx: Context) -> None:
        handled.append(event.value)

    member = Member(app, transport, f"g-{unique}", FAST, redis=redis, redis_prefix=prefix)
    producer = transport.producer()
    tp = TopicPartition(spec.name, 0)
    try:
        async with running(member):
            await producer.send(spec.name, b"before", key=b"k")
            await eventually(lambda: handled == [b"before"])
            mine = member._guard._stores[spec.lane]
            key = mine.keys.claims(spec.name, 0)
            other = lane_guards(redis, prefix, [spec])[spec.lane]  # another member process
            await other.take_claims({tp: (1, 1)})
            assert await redis.hget(key, "@owner") == other.instance.encode()
            owner_again = mine.instance.encode()
            deadline = asyncio.get_running_loop().time() + 60
            while await redis.hget(key, "@owner") != owner_again:  # found, rejoined, assigned
                assert asyncio.get_running_loop().time() < deadline, "the member never took it back"
                await asyncio.sleep(0.05)
            assert await other.claim({tp: (1, 200)}) == {tp}  # the other process's is refused
            await producer.send(spec.name, b"after", key=b"k")
            await eventually(lambda: handled == [b"before", b"after"])
    finally:
        await producer.close()


async def test_a_process_stalled_past_its_liveness_asks_before_it_starts_anything(
    redis: Redis, unique: str, prefix: str
) -> None:
    """Frozen longer than its liveness, A may have been taken for dead: it asks Redis first.

    Not taken over: the confirmation renews A's liveness and claim, and the message runs under
    the claim. Taken over by B while A was frozen: A starts nothing more of the partition.
    """
    lane = guarded_lane(f"claims_{unique}")
    handlers = Handlers()
    a, b, told = await _taken_over_later(redis, prefix, lane, handlers)
    store = a._stores[lane.name]
    messages = [main_message(lane, i, b"v%d" % i, key=b"k%d" % i) for i in range(1, 4)]
    store.live_until_s = time.monotonic()  # as after a freeze as long as its liveness
    await redis.hdel(store.keys.live, store.instance)  # which ran out in Redis meanwhile
    assert await a.run(lane, messages[0]) == "handled"
    assert a.calls == 0  # confirmed: still A's, run under the claim
    assert await redis.hget(store.keys.live, store.instance) is not None
    store.live_until_s = time.monotonic()  # frozen again, and B is assigned meanwhile
    await b()
    assert await asyncio.gather(*(a.run(lane, m) for m in messages[1:])) == [None, None]
    assert told == [[partition_0(lane)]]  # one confirmation for both, which found it taken over
    assert [v for _, v, _, _ in handlers.runs] == [b"v1"]
    await a.close()


async def test_a_claimed_run_that_waited_for_the_gate_through_a_freeze_asks_before_it_runs(
    redis: Redis, unique: str, prefix: str
) -> None:
    """A run decided under A's claim, waiting at the gate through A's freeze, does not run.

    It passed its claim check, then waited at the member's gate (a suspect ran alone) while A
    froze past its liveness and B was assigned the partition. Before, it ran once the gate
    opened, beside B's runs of the same keys (the freeze loop's overlaps on Kafka: runs decided
    before a freeze that entered their handler after it).
    """
    lane = guarded_lane(f"claims_{unique}")
    handlers = Handlers()
    a, b, told = await _taken_over_later(redis, prefix, lane, handlers)
    store = a._stores[lane.name]
    message = main_message(lane, 1, b"v1", key=b"k1")
    suspect_done = asyncio.Event()
    suspect_alone = asyncio.Event()

    async def suspect() -> None:
        async with a._isolation.alone():
            suspect_alone.set()
            await suspect_done.wait()

    lone = asyncio.create_task(suspect())
    await suspect_alone.wait()
    waiting = asyncio.create_task(a.run(lane, message))
    await asyncio.sleep(0)  # past its claim check, now at the gate
    assert not waiting.done()
    store.live_until_s = time.monotonic()  # frozen as long as its liveness, meanwhile
    await redis.hdel(store.keys.live, store.instance)
    await b()  # and its partition assigned to B
    suspect_done.set()
    await lone
    assert await asyncio.wait_for(waiting, 10) is None  # not run, not routed: B's now
    assert told == [[partition_0(lane)]]
    assert handlers.runs == []
    assert a.calls == 0
    await a.close()


async def _taken_over_later(
    redis: Redis, prefix: str, lane: Lane, handlers: Handlers
) -> tuple[RunGuard, Callable[[], Awaitable[None]], list[list[TopicPartition]]]:
    """A holds the partition; B's assignment of it is made when the returned call is awaited."""
    told: list[list[TopicPartition]] = []
    a = member_guard(redis, prefix, lane, handlers, "a", claims=True)
    a._claims[lane.name]._on_superseded = told.append
    await join(a, lane, [main_message(lane, 3, b"top")])
    b = member_guard(redis, prefix, lane, handlers, "b", claims=True)

    async def assign_b() -> None:
        await b.assigned([partition_0(lane)], {})

    return a, assign_b, told


async def test_keys_no_longer_parked_are_forgotten_once_many_are_remembered(
    redis: Redis, unique: str, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Keys whose heads succeeded and that had no later message are forgotten at the tick.

    A member remembers a key it parked until a later message of it is found not parked; without
    the tick's reading it would remember every key it ever parked (after an outage, all).
    """
    monkeypatch.setattr(claims_module, "FORGET_PARKED_ABOVE", 2)
    lane = guarded_lane(f"claims_{unique}")
    handlers = Handlers()
    a = member_guard(redis, prefix, lane, handlers, "a", claims=True)
    keys = [b"k0", b"k1", b"k2", b"k3"]
    heads = [main_message(lane, i, b"x%d" % i, key=key) for i, key in enumerate(keys)]
    await join(a, lane, heads)
    for head in heads:
        handlers.outcomes[head.value] = ["retried"]
        assert await a.run(lane, head) == "retried"  # each key parks
    for i, key in enumerate(keys[:3]):  # three heads' copies succeed: their keys are free
        assert await a.run(lane, retry_copy(lane, i, i, b"x%d" % i, key=key)) == "handled"
    claims = a._claims[lane.name]
    assert claims.maybe_parked == {encode_key(key) for key in keys}
    await a.tick({lane.name: lane})
    assert claims.maybe_parked == {encode_key(b"k3")}  # the one Redis still has parked
    follower = main_message(lane, 4, b"y", key=b"k3")
    await a.extend([follower])
    assert await a.run(lane, follower) == "parked"  # still held behind its head
    free = main_message(lane, 5, b"z", key=b"k0")
    await a.extend([free])
    calls = a.calls
    assert await a.run(lane, free) == "handled"
    assert a.calls == calls  # a forgotten key's next message runs under the claim, unasked


async def test_no_key_being_parked_or_learnt_of_during_the_reading_is_forgotten(
    redis: Redis,
    unique: str,
    prefix: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Nothing is read while a parking call is under way; keys learnt of meanwhile stay.

    A key's parking may reach Redis after the reading, so while this member's call is under
    way the reading waits for a later tick. Below the bound nothing is read; a failed reading
    leaves every key remembered.
    """
    monkeypatch.setattr(claims_module, "FORGET_PARKED_ABOVE", 2)
    lane = guarded_lane(f"claims_{unique}")
    _, store, _, claims = await _one_member(redis, prefix, lane)
    real = store.parked_keys
    reads = 0

    async def counted() -> set[str]:
        nonlocal reads
        reads += 1
        found = await real()
        claims.decided("late", "held")  # the exact path holds a message while the reply comes
        return found

    monkeypatch.setattr(store, "parked_keys", counted)
    for key in ("a", "b"):
        claims.decided(key, "held")  # remembered; none of them is parked in Redis
    await claims.forget_unparked()
    assert reads == 0  # not past the bound
    with claims.parking("c"):  # its call under way
        await claims.forget_unparked()
        assert reads == 0
    assert claims.maybe_parked == {"a", "b", "c"}

    async def unreachable() -> set[str]:
        raise rexc.ConnectionError("Connection refused")

    monkeypatch.setattr(store, "parked_keys", unreachable)
    with caplog.at_level(logging.WARNING, logger="pipeline.runtime.claims"):
        await claims.forget_unparked()
    assert claims.maybe_parked == {"a", "b", "c"}
    assert "keep 3 keys as maybe parked" in caplog.text

    monkeypatch.setattr(store, "parked_keys", counted)
    await claims.forget_unparked()
    assert reads == 1
    assert claims.maybe_parked == {"late"}


async def test_the_key_of_a_failed_parking_call_is_kept_through_readings(
    redis: Redis, unique: str, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A parking call that failed may reach Redis after a reading: its key is not forgotten.

    Failed: no answer (``unsure``), or cancelled in the block. Only a later message of the key
    found not parked (the exact path deciding ``process``) lets it go; the keys of calls that
    returned are forgotten as before.
    """
    monkeypatch.setattr(claims_module, "FORGET_PARKED_ABOVE", 1)
    lane = guarded_lane(f"claims_{unique}")
    _, _, _, claims = await _one_member(redis, prefix, lane)
    with claims.parking("returned"):
        pass  # its call returned (the key is not parked in Redis: its head was freed since)
    with claims.parking("timed out"):
        claims.unsure("timed out")  # sent; whether Redis ran it is unknown
    with contextlib.suppress(asyncio.CancelledError), claims.parking("cancelled"):
        raise asyncio.CancelledError
    claims.decided("other", "held")
    assert claims.maybe_parked == {"returned", "timed out", "cancelled", "other"}
    await claims.forget_unparked()  # none of them is parked in Redis now
    assert claims.maybe_parked == {"timed out", "cancelled"}  # their next messages ask
    assert claims.seen_parked("timed out")
    claims.decided("timed out", "process")  # a later message of it was found not parked
    claims.decided("cancelled", "process")
    assert claims.maybe_parked == set()
    for key in ("x", "y", "z", "w", "v"):  # past twice what the last reading kept
        claims.decided(key, "held")
    await claims.forget_unparked()
    assert claims.maybe_parked == set()  # the unsure keys are no longer kept either


async def test_a_key_whose_parking_calls_timed_out_is_asked_for_after_a_reading(
    redis: Redis, unique: str, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Redis stalls while a head fails: its ``gd_route`` and its parking end time out here.

    Redis runs them later, after the member's reading of the parked keys, so the key is
    parked although the reading did not find it. The member must not forget the key on the
    strength of that reading: its next message asks, and waits behind the head.
    """
    monkeypatch.setattr(claims_module, "FORGET_PARKED_ABOVE", 1)
    lane = guarded_lane(f"claims_{unique}")
    a, runs = routing_guard(redis, prefix, lane, b"x", claims=True)  # x...: fails once, routed
    keys = [b"k0", b"k1", b"k2"]
    heads = [main_message(lane, i, b"x%d" % i, key=key) for i, key in enumerate(keys)]
    await join(a, lane, heads)
    store = a._stores[lane.name]
    route, end_many = store.route, store.end_many
    late: list[Callable[[], Awaitable[object]]] = []

    async def route_timed_out(start: Start, attempt: int, *, park: bool) -> bool:
        late.append(lambda: route(start, attempt, park=park))
        return False  # what GuardStore.route answers on a timeout (logged)

    async def end_timed_out(groups: Sequence[KeyEnds]) -> list[list[Release]]:
        late.append(lambda: end_many(groups))
        raise rexc.TimeoutError("Timeout reading from socket")

    monkeypatch.setattr(store, "route", route_timed_out)
    monkeypatch.setattr(store, "end_many", end_timed_out)
    assert await a.run(lane, heads[0]) == "retried"  # its copy went to the tier all the same
    assert len(late) == 2  # the route, then the end that parks the key
    monkeypatch.setattr(store, "route", route)
    monkeypatch.setattr(store, "end_many", end_many)
    for head in heads[1:]:
        assert await a.run(lane, head) == "retried"  # parked in Redis, as usual
    for i, key in enumerate(keys[1:], 1):  # their copies succeed: those keys are free again
        assert await a.run(lane, retry_copy(lane, i, i, b"x%d" % i, key=key)) == "handled"
    claims = a._claims[lane.name]
    await a.tick({lane.name: lane})  # the reading: k0's calls have not reached Redis yet
    assert claims.maybe_parked == {encode_key(b"k0")}
    for call in late:  # Redis runs the stalled calls now: k0 is parked
        await call()
    follower = main_message(lane, 3, b"y", key=b"k0")
    await a.extend([follower])
    assert await a.run(lane, follower) == "parked"  # held behind its head, not run unasked
    assert b"y" not in runs


async def test_claims_below_the_committed_position_are_deleted_when_the_partition_is_taken(
    redis: Redis, prefix: str, unique: str
) -> None:
    """A crashed process's claim of finished offsets goes at the next assignment; others stay.

    A process that crashes never gives its claim up, and the owner's renewals keep the hash from
    expiring: before, every crash of a crash loop left one more field, read back and waited on
    at every later assignment.
    """
    spec = lane_spec(f"prune_{unique}", 1, retry={"tiers": ["1s"]})
    tp = TopicPartition(spec.name, 0)
    owner = lane_guards(redis, prefix, [spec])[spec.lane]
    key = owner.keys.claims(spec.name, 0)
    # What a crash loop leaves: claims no process gives up, the last one's still running.
    left = {f"dead-{n}": f"{50 * n}|{50 * n + 49}" for n in range(4)}
    await redis.hset(key, mapping={**left, "@owner": "dead-3"})
    (hi, others) = (await owner.take_claims({tp: (120, 169)}))[tp]
    assert others == {"dead-2": (100, 149), "dead-3": (150, 199)}  # reaching the commit or past
    assert hi == 199
    fields = {k.decode() for k in await redis.hkeys(key)}
    assert fields == {"@owner", owner.instance, "dead-2", "dead-3"}
