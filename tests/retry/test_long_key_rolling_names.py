"""Members of this release and of the one before the key bound share a lane's long parked keys.

A member of the earlier release names a parked key over 768 bytes by its base64 only; one of
this release by its digest. Side by side in one group (a rolling update, or its rollback), each
must find what the other parked, or held followers are never released. The earlier release's
calls are made here with this build's guard functions given the earlier name (the functions'
layout did not change, only the name: ``test_rename_long_parked``), by a store whose instance
id has the earlier form (16 hex digits) and which names every key by one name.
"""

from __future__ import annotations

import logging

import pytest
from redis.asyncio import Redis
from test_rename_long_parked import LONG, earlier_name, store_of

from pipeline.envelope import Message
from pipeline.retry.guard_store import GuardStore, KeyEnds, Start, start_of
from pipeline.retry.keys import encode_key
from pipeline.retry.rename_long_keys import LongKeyNames, rename_long_parked

RAW = b"r" * LONG


def earlier_member(store: GuardStore) -> GuardStore:
    """A store of the same lane acting as a member of the earlier release."""
    earlier = GuardStore(
        store.client, store.prefix, store.lane, ttl_ms=store.ttl_ms, hold_ms=store.hold_ms
    )
    earlier.instance = earlier.instance[:16]
    return earlier


def first(topic: str, offset: int) -> Message:
    """A first delivery of the long key at ``offset``."""
    return Message(topic, 0, offset, RAW, f"v{offset}".encode())


def old_start(topic: str, offset: int) -> Start:
    """The earlier release's start of :func:`first`: one name, the key's base64."""
    ident = f"{topic}:0:{offset}"
    return Start(ident, earlier_name(RAW), ident, ordered=True)


def copy_of(start: Start, topic: str, *, name: str, alias: str = "") -> Start:
    """The retry copy of ``start`` read from the tier, its key named as given."""
    return Start(start.ident, name, f"{topic}.retry.1s:0:0", ordered=True, attempt=2, alias=alias)


async def parked_names(redis: Redis, store: GuardStore) -> list[str]:
    """The names the lane's keys are parked under (their first 12 characters)."""
    names = await redis.hkeys(store.keys.parked)
    return sorted((name.decode() if isinstance(name, bytes) else name)[:12] for name in names)


async def test_this_release_holds_behind_and_releases_a_key_the_earlier_one_parked(
    redis: Redis, unique: str
) -> None:
    """Upgrade: the earlier member parked the key; this one holds the next message behind it."""
    store, topic = store_of(redis, unique)
    old = earlier_member(store)
    head = old_start(topic, 0)
    assert await old.begin_many([], [head]) == [("process", 1)]
    assert await old.route(head, 2, park=True)
    await old.begin_many([head.end_line + "\t1"], [])
    store.earlier_live = False  # as once it stopped: this member parks under digests now
    follower = start_of(first(topic, 1), ordered=True)
    assert follower.key == encode_key(RAW)
    assert follower.alias == earlier_name(RAW)
    assert await store.begin_parked(first(topic, 1), follower) == ("held", 0)
    copy = copy_of(head, topic, name=follower.key, alias=follower.alias)
    assert await store.begin_many([], [copy]) == [("head", 1)]
    [released] = await store.end_many([KeyEnds([(copy, "done")], follow_dead=False)])
    assert [r.ident for r in released] == [follower.ident]
    assert released[0].alias == earlier_name(RAW), "its end finds the key under either name"
    end = Start(
        follower.ident, released[0].key, "rel", ordered=True, attempt=0, alias=released[0].alias
    )
    assert await store.end_many([KeyEnds([(end, "done")], follow_dead=False)]) == [[]]
    assert await redis.hlen(store.keys.parked) == 0


async def test_beside_a_live_earlier_member_a_long_key_is_parked_under_the_name_it_finds(
    redis: Redis, unique: str, caplog: pytest.LogCaptureFixture
) -> None:
    """This release parks under the base64 name while an earlier member lives; it holds there."""
    store, topic = store_of(redis, unique)
    old = earlier_member(store)
    await old.live()
    with caplog.at_level(logging.INFO, logger="pipeline.retry.guard_store"):
        await store.live()
    assert store.earlier_live
    assert any(
        "1 members of the release before the key bound run" in r.message for r in caplog.records
    )
    head = start_of(first(topic, 0), ordered=True)
    assert await store.begin_many([], [head]) == [("process", 1)]
    assert await store.route(head, 2, park=True)
    assert await parked_names(redis, store) == [earlier_name(RAW)[:12]]
    # The earlier member holds the next message behind it, and runs the head's copy.
    nxt = old_start(topic, 1)
    assert await old.begin_parked(first(topic, 1), nxt) == ("held", 0)
    copy = copy_of(head, topic, name=earlier_name(RAW))
    await store.begin_many([head.end_line + "\t1"], [])
    assert await old.begin_many([], [copy]) == [("head", 1)]
    [released] = await old.end_many([KeyEnds([(copy, "done")], follow_dead=False)])
    assert [r.ident for r in released] == [nxt.ident]


async def test_a_rollback_moves_digest_named_keys_to_the_names_an_earlier_member_finds(
    redis: Redis, unique: str
) -> None:
    """Parked under its digest, then an earlier member comes: the reap tick moves the key."""
    store, topic = store_of(redis, unique)
    await store.live()
    assert not store.earlier_live
    head = start_of(first(topic, 0), ordered=True)
    assert await store.begin_many([], [head]) == [("process", 1)]
    assert await store.route(head, 2, park=True)
    follower = start_of(first(topic, 1), ordered=True)
    assert await store.begin_parked(first(topic, 1), follower) == ("held", 0)
    await store.begin_many([head.end_line + "\t1"], [])
    assert await parked_names(redis, store) == [encode_key(RAW)[:12]]
    names = LongKeyNames(store.client, store.prefix, store.lane)
    await names.tick(store.earlier_live)  # nothing to move: no earlier member
    assert await parked_names(redis, store) == [encode_key(RAW)[:12]]
    old = earlier_member(store)
    await old.live()
    await store.live()
    await names.tick(store.earlier_live)
    assert await parked_names(redis, store) == [earlier_name(RAW)[:12]]
    # The earlier member finds the key: the head's copy is its head, its end releases in order.
    copy = copy_of(head, topic, name=earlier_name(RAW))
    assert await old.begin_many([], [copy]) == [("head", 1)]
    [released] = await old.end_many([KeyEnds([(copy, "done")], follow_dead=False)])
    assert [r.ident for r in released] == [follower.ident]


async def test_a_key_whose_release_is_in_progress_is_not_moved_until_it_is_over(
    redis: Redis, unique: str
) -> None:
    """A release's member renews it under the name it has: its key waits for the next pass."""
    store, topic = store_of(redis, unique)
    await store.live()
    head = start_of(first(topic, 0), ordered=True)
    assert await store.begin_many([], [head]) == [("process", 1)]
    assert await store.route(head, 2, park=True)
    for offset in (1, 2):
        follower = start_of(first(topic, offset), ordered=True)
        assert await store.begin_parked(first(topic, offset), follower) == ("held", 0)
    await store.begin_many([head.end_line + "\t1"], [])
    copy = copy_of(head, topic, name=head.key, alias=head.alias)
    assert await store.begin_many([], [copy]) == [("head", 1)]
    [released] = await store.end_many([KeyEnds([(copy, "done")], follow_dead=False)])
    assert len(released) == 2  # both run now, in this member: the release is in progress
    old = earlier_member(store)
    await old.live()
    await store.live()
    names = LongKeyNames(store.client, store.prefix, store.lane)
    await names.tick(store.earlier_live)
    assert await parked_names(redis, store) == [encode_key(RAW)[:12]], "moved mid-release"
    await store.renew([store.name_of(released[0].key, released[0].alias)])
    ends = [
        (Start(r.ident, r.key, "rel", ordered=True, attempt=0, alias=r.alias), "done")
        for r in released
    ]
    assert await store.end_many([KeyEnds(ends, follow_dead=False)]) == [[]]  # type: ignore[arg-type]
    assert await redis.hlen(store.keys.parked) == 0


async def test_the_start_leaves_long_keys_alone_while_an_earlier_member_runs(
    redis: Redis, unique: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A rolling update: the earlier member would lose sight of the keys the start moved."""
    store, topic = store_of(redis, unique)
    old = earlier_member(store)
    await old.live()
    head = old_start(topic, 0)
    assert await old.begin_many([], [head]) == [("process", 1)]
    assert await old.route(head, 2, park=True)
    with caplog.at_level(logging.INFO, logger="pipeline.retry.rename_long_keys"):
        assert await rename_long_parked(redis, f"t{unique}", [store.lane]) == 0
    assert await parked_names(redis, store) == [earlier_name(RAW)[:12]]
    [line] = [r.getMessage() for r in caplog.records]
    assert "1 members of the release before the key bound run (a rolling update)" in line
