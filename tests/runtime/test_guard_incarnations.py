"""Finished ids remember which message finished: a position given out again names a new one.

The guard names a message by its first delivery's position and keeps the ids that left a
parked key (``T:gone``) with that delivery's broker time (``T:born:gone``, ``pl-origin-ms`` on
the copies). A start born at another time is a new message at a reused position (its topic
created anew): it runs. A start or a record whose birth is not known (a copy or a record of an
earlier release, during a rolling update) keeps the old meaning: stale.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import pytest
from redis.asyncio import Redis
from runtime.guard_parts import guarded_lane, routing_guard

from pipeline import headers as h
from pipeline.envelope import Delivered, Message, Record
from pipeline.headers import ORIGIN_MS
from pipeline.retry.guard_store import start_of
from pipeline.retry.router import RetryRouter
from pipeline.runtime.app import Lane
from pipeline.runtime.guard import RunGuard

OLD_MS = 1_700_000_000_000
NEW_MS = 1_700_000_900_000


def _first(lane: Lane, value: bytes, born: int) -> Message:
    """A first delivery at main offset 0, produced at ``born``."""
    return Message(lane.spec.name, 0, 0, b"k", value, timestamp_ms=born)


def _copy(lane: Lane, value: bytes, born: int | None, offset: int = 0) -> Message:
    """Main offset 0's copy in the first tier (attempt 2), its birth written unless None."""
    headers = {
        h.ORIGIN_TOPIC: lane.spec.name.encode(),
        h.ORIGIN_PARTITION: b"0",
        h.ORIGIN_OFFSET: b"0",
        h.ATTEMPT: b"2",
    }
    if born is not None:
        headers[ORIGIN_MS] = str(born).encode()
    return Message(lane.routes.retry_topics[0], 0, offset, b"k", value, headers, born or 1)


async def _finished(guard: RunGuard, lane: Lane, copy_born: int | None) -> None:
    """The old message at offset 0 failed once, then its copy was handled: its id is gone."""
    assert await guard.run(lane, _first(lane, b"x-old", OLD_MS)) == "retried"
    assert await guard.run(lane, _copy(lane, b"x-old", copy_born)) == "handled"
    await guard.flush()


async def test_a_new_message_at_a_finished_position_runs_and_retries(
    redis: Redis, unique: str, prefix: str
) -> None:
    """A message born at NEW_MS at an id that finished born at OLD_MS runs, and so does its copy.

    The old message's deliveries, read again, are still stale.
    """
    lane = guarded_lane(f"gi_{unique}")
    guard, runs = routing_guard(redis, prefix, lane, b"x")
    await _finished(guard, lane, OLD_MS)
    store = guard._stores[lane.name]
    ident = f"{lane.spec.name}:0:0"
    assert await redis.hget(store.keys.births, ident) == str(OLD_MS).encode()

    assert await guard.run(lane, _first(lane, b"x-old", OLD_MS)) == "duplicate"
    assert await guard.run(lane, _copy(lane, b"x-old", OLD_MS)) == "duplicate"

    assert await guard.run(lane, _first(lane, b"x-new", NEW_MS)) == "retried"
    assert await guard.run(lane, _copy(lane, b"x-new", NEW_MS, offset=1)) == "handled"
    await guard.flush()
    assert runs == [b"x-old", b"x-old", b"x-new", b"x-new"]
    assert await redis.hget(store.keys.births, ident) == str(NEW_MS).encode()
    assert await redis.hlen(f"{store.keys.tag}:parked") == 0


@pytest.mark.parametrize("unknown", ["the record's birth", "the copy's birth"])
async def test_an_unknown_birth_keeps_a_finished_id_stale(
    redis: Redis, unique: str, prefix: str, unknown: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A birth not known on either side keeps today's meaning: stale, never run twice.

    In a rolling update a copy made by the previous release carries no ``pl-origin-ms``, and
    its members record finished ids without a birth. The first delivery read again, and a copy
    without a birth, are dropped (one WARNING a lane).
    """
    lane = guarded_lane(f"gu_{unique}")
    guard, runs = routing_guard(redis, prefix, lane, b"x")
    await _finished(guard, lane, None if unknown == "the record's birth" else OLD_MS)
    with caplog.at_level(logging.WARNING, logger="pipeline.runtime.guard"):
        assert await guard.run(lane, _first(lane, b"x-old", OLD_MS)) == "duplicate"
        assert await guard.run(lane, _copy(lane, b"x-old", None, offset=1)) == "duplicate"
    assert runs == [b"x-old", b"x-old"]
    told = [r.getMessage() for r in caplog.records if "without running it" in r.getMessage()]
    assert len(told) == 1, told
    assert f"lane {lane.name}: dropped {lane.spec.name}:0:0 read at" in told[0]
    assert f"{{{prefix}:guard:{lane.name}}}:born:gone" in told[0]


async def test_births_are_trimmed_with_the_finished_ids(
    redis: Redis, unique: str, prefix: str
) -> None:
    """The reap that trims an id from ``T:gone`` drops its birth too; both expire."""
    lane = guarded_lane(f"gt_{unique}")
    guard, _ = routing_guard(redis, prefix, lane, b"x")
    await _finished(guard, lane, OLD_MS)
    store = guard._stores[lane.name]
    await store.reap()
    assert await redis.hlen(store.keys.births) == 1
    assert 0 < await redis.pttl(store.keys.births) <= store.hold_ms
    store.ttl_ms = 0  # every finished id is older than that
    await store.reap()
    assert await redis.zscore(store.keys.gone, f"{lane.spec.name}:0:0") is None
    assert await redis.exists(store.keys.births) == 0


class _Sent:
    """Stands in for the broker: keeps each record the router produces, with its headers."""

    def __init__(self) -> None:
        self.records: list[Record] = []

    async def send_many(self, topic: str, records: Sequence[Record]) -> list[Delivered]:
        self.records += records
        return [Delivered(topic, 0, len(self.records)) for _ in records]

    async def send(self, topic: str, value: bytes, **kw: object) -> Delivered:
        self.records.append(Record(value, kw.get("key"), kw.get("headers")))  # type: ignore[arg-type]
        return Delivered(topic, 0, len(self.records))


async def test_every_copy_carries_its_first_deliverys_broker_time() -> None:
    """A copy carries its first delivery's broker time, whatever else the headers held.

    The first copy writes the main delivery's time; a copy of a copy keeps it; a main-topic
    message's forged or stale ``pl-origin-ms`` is replaced (or dropped if its time is unknown).
    """
    lane = guarded_lane("gr")
    sent = _Sent()
    router = RetryRouter(sent)  # type: ignore[arg-type]
    forged = {ORIGIN_MS: b"42"}
    first = Message(lane.spec.name, 0, 5, b"k", b"v", dict(forged), OLD_MS)
    await router.retry(lane.routes, first, 1, RuntimeError("flaky"))
    copy_headers = dict(sent.records[-1].headers or {})
    assert copy_headers[ORIGIN_MS] == str(OLD_MS).encode()
    copy = Message(lane.routes.retry_topics[0], 0, 0, b"k", b"v", copy_headers, NEW_MS)
    assert start_of(copy, ordered=True).born == OLD_MS
    await router.retry(lane.routes, copy, 2, RuntimeError("flaky"))
    assert (sent.records[-1].headers or {})[ORIGIN_MS] == str(OLD_MS).encode()
    untimed = Message(lane.spec.name, 0, 6, b"k", b"v", dict(forged), 0)
    await router.retry(lane.routes, untimed, 1, RuntimeError("flaky"))
    assert ORIGIN_MS not in (sent.records[-1].headers or {})


async def test_a_sequenced_dead_letter_is_logged_by_topic_partition_and_offset(
    redis: Redis, unique: str, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    """``dead-lettering gs_x[0]@1: sequenced``, as the project's other lines name a message."""
    lane = guarded_lane(f"gs_{unique}")
    guard, _ = routing_guard(redis, prefix, lane, b"x")
    message = Message(lane.spec.name, 0, 1, b"k", b"y", timestamp_ms=OLD_MS)
    store = guard._stores[lane.name]
    with caplog.at_level(logging.WARNING, logger="pipeline.runtime.guard"):
        await guard._carry_out(
            lane, store, message, start_of(message, ordered=True), "sequenced", 0
        )
    lines = [r.getMessage() for r in caplog.records]
    assert f"dead-lettering {lane.spec.name}[0]@1: sequenced" in lines


@pytest.mark.parametrize(("born", "verdict"), [(NEW_MS, ("process", 1)), (OLD_MS, ("stale", 0))])
async def test_a_suspect_born_anew_at_a_finished_position_is_counted_not_dropped(
    redis: Redis, unique: str, prefix: str, born: int, verdict: tuple[str, int]
) -> None:
    """``gd_solo`` tells a new message at a finished id from the old one too."""
    lane = guarded_lane(f"gv_{unique}")
    guard, _ = routing_guard(redis, prefix, lane, b"x")
    await _finished(guard, lane, OLD_MS)
    store = guard._stores[lane.name]
    start = start_of(_first(lane, b"x-new", born), ordered=True)
    await redis.hset(store.keys.run, start.ident, f"2|{start.position}||dead-member")
    assert await store.solo(start, poison_after=3) == verdict
