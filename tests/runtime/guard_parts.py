"""Two run guards on one real Redis, with the broker and the handler stage stood in for.

The guard suites (``test_guard.py``, ``test_claims.py``) build members from these: the router's
producer is the one collaborator faked (these suites are about the guard's decisions, not about
producing), and the handler stage records every run and can hold one until released.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Sequence

import pytest
from redis import exceptions as rexc
from redis.asyncio import Redis
from runtime.helpers import lane_spec

from pipeline import headers as h
from pipeline.envelope import Delivered, Message, Record
from pipeline.retry.guard_store import GuardStore, KeyEnds, Release, Start, lane_guards
from pipeline.retry.policy import default_retryable
from pipeline.retry.router import RetryRouter
from pipeline.runtime import App, Context
from pipeline.runtime.app import Lane
from pipeline.runtime.claims import LaneClaims
from pipeline.runtime.guard import RunGuard
from pipeline.runtime.isolation import Isolation
from pipeline.runtime.redirect import Redirector
from pipeline.runtime.stats import Stats


class Producer:
    """Stands in for the broker: records what the router sends."""

    def __init__(self) -> None:
        """Nothing sent yet."""
        self.sent: list[tuple[str, bytes]] = []

    async def send(self, topic: str, value: bytes, **_: object) -> Delivered:
        """Record one message; acknowledged at once."""
        self.sent.append((topic, value))
        return Delivered(topic, 0, len(self.sent))

    async def send_many(self, topic: str, records: Sequence[Record]) -> list[Delivered]:
        """Record a batch."""
        return [await self.send(topic, r.value) for r in records]

    async def flush(self) -> None:
        """Nothing buffered."""
        return

    async def close(self) -> None:
        """Nothing to release."""
        return


class Handlers:
    """The handler stage of both members: records every run and can hold one until released."""

    def __init__(self) -> None:
        """No runs yet."""
        self.tick = itertools.count()
        self.runs: list[tuple[str, bytes, int, int]] = []  # member, value, start, end
        self.hold: dict[bytes, asyncio.Event] = {}
        self.started: dict[bytes, asyncio.Event] = {}
        self.outcomes: dict[bytes, list[str | None]] = {}

    def stage(self, member: str):
        """The handler stage of ``member``: records each run, holding it while told to."""

        async def call(_lane: Lane, message: Message) -> str | None:
            begin = next(self.tick)
            self.started.setdefault(message.value, asyncio.Event()).set()
            gate = self.hold.get(message.value)
            if gate is not None:
                await gate.wait()
            outcomes = self.outcomes.get(message.value)
            outcome = outcomes.pop(0) if outcomes else "handled"
            self.runs.append((member, message.value, begin, next(self.tick)))
            return outcome

        return call

    def overlaps(self) -> int:
        """Runs of the key that overlapped another run of it."""
        runs = sorted(self.runs, key=lambda r: r[2])
        return sum(1 for a, b in itertools.pairwise(runs) if b[2] < a[3])


def guarded_lane(name: str) -> Lane:
    """A lane with retry tiers ``1s, 5s`` on one partition; its handler is never called."""
    app = App([lane_spec(name, 1, retry={"tiers": ["1s", "5s"]})])

    @app.handler(name)
    async def handle(event: bytes, ctx: Context) -> None:
        raise AssertionError("the handler stage is replaced in these tests")

    return app.lanes[name]


def member_guard(
    redis: Redis,
    prefix: str,
    lane: Lane,
    handlers: Handlers,
    member: str,
    *,
    claims: bool = False,
    isolation: Isolation | None = None,
) -> RunGuard:
    """One member's guard; with ``claims``, first deliveries run under claimed ranges."""
    stats = Stats()
    routing = Redirector(RetryRouter(Producer()), stats, default_retryable, [lane])  # type: ignore[arg-type]
    stores = lane_guards(redis, prefix, [lane.spec])
    for store in stores.values():
        store.lease_ms = 300
    chosen = None
    if claims:
        store = stores[lane.name]
        chosen = {lane.name: LaneClaims(store, lane.spec.name, ordered=True, ahead=100)}
    return RunGuard(
        stores,
        routing,
        stats,
        isolation or Isolation(5.0),
        handlers.stage(member),
        lambda *_: None,
        claims=chosen,
    )


def main_message(lane: Lane, offset: int, value: bytes, key: bytes = b"k") -> Message:
    """A first delivery on the lane's main topic, partition 0."""
    return Message(lane.spec.name, 0, offset, key, value)


def retry_copy(
    lane: Lane, origin_offset: int, offset: int, value: bytes, key: bytes = b"k"
) -> Message:
    """The copy of main offset ``origin_offset`` in the first retry tier, as attempt 2."""
    headers = {
        h.ORIGIN_TOPIC: lane.spec.name.encode(),
        h.ORIGIN_PARTITION: b"0",
        h.ORIGIN_OFFSET: str(origin_offset).encode(),
        h.ATTEMPT: b"2",
    }
    return Message(lane.routes.retry_topics[0], 0, offset, key, value, headers)


def routing_guard(
    redis: Redis, prefix: str, lane: Lane, fails: bytes, *, claims: bool = False
) -> tuple[RunGuard, list[bytes]]:
    """A guard whose handler stage routes for real; returns it and the values it ran.

    Main-topic values starting with ``fails`` fail once and go to the first tier, parking
    their key; everything else is handled.
    """
    stats = Stats()
    routing = Redirector(RetryRouter(Producer()), stats, default_retryable, [lane])  # type: ignore[arg-type]
    runs: list[bytes] = []

    async def stage(lane_: Lane, message: Message) -> str | None:
        runs.append(message.value)
        if message.value.startswith(fails) and message.topic == lane_.spec.name:
            return await routing.failure(lane_, message, 1, RuntimeError("flaky"))
        return "handled"

    stores = lane_guards(redis, prefix, [lane.spec])
    chosen = None
    if claims:
        chosen = {lane.name: LaneClaims(stores[lane.name], lane.spec.name, ordered=True, ahead=100)}
    guard = RunGuard(stores, routing, stats, Isolation(5.0), stage, lambda *_: None, claims=chosen)
    return guard, runs


def parking_calls_time_out(monkeypatch: pytest.MonkeyPatch, store: GuardStore) -> None:
    """``store``'s parking calls get no answer (until ``monkeypatch.undo()``).

    ``route`` answers False, as :meth:`GuardStore.route` does on a timeout (logged), and
    ``end_many`` raises the TimeoutError redis-py raises: Redis may still run either later.
    """

    async def route_timed_out(start: Start, attempt: int, *, park: bool) -> bool:
        return False

    async def end_timed_out(groups: Sequence[KeyEnds]) -> list[list[Release]]:
        raise rexc.TimeoutError("Timeout reading from socket")

    monkeypatch.setattr(store, "route", route_timed_out)
    monkeypatch.setattr(store, "end_many", end_timed_out)
