"""Keys an earlier release parked under their long base64 names are moved to their digest names.

Before the key bound, a parked message key's state was named by its url-safe base64 whatever
its size; now a key over 768 bytes is named ``#sha256:<hex>``. The earlier layout is written
here with this build's own guard functions (the layout did not change, only the name) given the
earlier name: :func:`earlier_name` is the earlier release's ``encode_key``, reproduced.
"""

from __future__ import annotations

import asyncio
import base64
import logging
from pathlib import Path

import pytest
from ingress.redis_server import private_redis
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from runtime.helpers import consume_until_logged, lane_spec, the_line

from pipeline.envelope import Message
from pipeline.retry.guard_store import GuardStore, KeyEnds, Start, lane_guards
from pipeline.retry.keys import encode_key
from pipeline.retry.rename_long_keys import current_name, rename_long_parked

LONG = 800
"""Bytes of a long message key: its base64 form (1,068 characters) is over the bound."""


def earlier_name(raw: bytes) -> str:
    """How the release before the key bound named a parked key: its base64, whatever its size."""
    return base64.urlsafe_b64encode(raw).decode()


def store_of(redis: Redis, unique: str) -> tuple[GuardStore, str]:
    """The guard store of an ordered lane with a retry tier, and its lane's topic."""
    spec = lane_spec(f"ren_{unique}", 1, retry={"tiers": ["1s"]})
    return lane_guards(redis, f"t{unique}", [spec])[spec.lane], spec.name


async def park(
    store: GuardStore, topic: str, name: str, raw: bytes, offset: int, followers: int
) -> tuple[Start, list[str]]:
    """Park key ``raw`` as ``name``: its head (at ``offset``) in a tier, ``followers`` held."""
    head = Start(f"{topic}:0:{offset}", name, f"{topic}:0:{offset}", ordered=True)
    assert await store.begin_many([], [head]) == [("process", 1)]
    assert await store.route(head, 2, park=True)
    held = []
    for i in range(1, followers + 1):
        ident = f"{topic}:0:{offset + i}"
        follower = Start(ident, name, ident, ordered=True)
        message = Message(topic, 0, offset + i, raw, f"v{i}".encode())
        assert await store.begin_parked(message, follower) == ("held", 0)
        held.append(ident)
    await store.begin_many([head.end_line + "\t1"], [])
    return head, held


async def finish_head(store: GuardStore, topic: str, head: Start, raw: bytes) -> list[str]:
    """The head's copy comes back (this build names its key) and succeeds; what it releases."""
    key = encode_key(raw)
    copy = Start(head.ident, key, f"{topic}.retry.1s:0:0", ordered=True, attempt=2)
    decided = await store.begin_many([], [copy])
    [released] = await store.end_many([KeyEnds([(copy, "done")], follow_dead=False)])
    assert decided == [("head", 1)], "the head's copy does not find its key parked"
    return [r.ident for r in released]


async def test_held_followers_of_a_key_parked_under_its_earlier_name_run_after_the_move(
    redis: Redis, unique: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The earlier release parked an 800-byte key with two followers: they run, in order."""
    store, topic = store_of(redis, unique)
    raw = b"k" * LONG
    head, held = await park(store, topic, earlier_name(raw), raw, 0, followers=2)
    with caplog.at_level(logging.INFO, logger="pipeline.retry.rename_long_keys"):
        moved = await rename_long_parked(redis, f"t{unique}", [store.lane])
    assert await finish_head(store, topic, head, raw) == held
    assert moved == 1
    [line] = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert line.startswith(f"moved 1 parked keys of lane {store.lane} from an earlier release")
    old_z, old_h, old_f = store.keys.of_key(earlier_name(raw))
    assert await redis.exists(old_z, old_h, old_f) == 0
    assert await redis.hkeys(store.keys.parked) == [encode_key(raw).encode()]
    z, state, _ = store.keys.of_key(encode_key(raw))
    assert await redis.pttl(z) > 0, "the moved state keeps its expiry"
    # The followers run and end: the key's state is deleted, nothing is left parked.
    ends = [
        (Start(ident, encode_key(raw), "rel", ordered=True, attempt=0), "done") for ident in held
    ]
    assert await store.end_many([KeyEnds(ends, follow_dead=False)]) == [[]]  # type: ignore[arg-type]
    assert await redis.exists(z, state) == 0
    assert await redis.hlen(store.keys.parked) == 0
    assert await redis.zcard(store.keys.releases) == 0


async def test_keys_already_named_as_this_release_names_them_are_left_alone(
    redis: Redis, unique: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A short key and a long key parked by this release: no move, no line, state unchanged."""
    store, topic = store_of(redis, unique)
    short, long = b"short", b"l" * LONG
    await park(store, topic, encode_key(short), short, 0, followers=1)
    await park(store, topic, encode_key(long), long, 10, followers=1)
    before = sorted(await redis.hkeys(store.keys.parked))
    with caplog.at_level(logging.INFO, logger="pipeline.retry.rename_long_keys"):
        assert await rename_long_parked(redis, f"t{unique}", [store.lane]) == 0
    assert caplog.records == []
    assert sorted(await redis.hkeys(store.keys.parked)) == before
    assert current_name(encode_key(long)) is None
    assert current_name(encode_key(short)) is None
    assert current_name(earlier_name(b"x" * 768)) is None, "768 bytes: 1,024 characters, kept"
    assert current_name(earlier_name(b"x" * 769)) == encode_key(b"x" * 769)
    for raw in (short, long):
        assert await redis.exists(*store.keys.of_key(encode_key(raw))) == 3


async def test_two_members_starting_at_once_move_every_key_once(
    redis: Redis, redis_service: str, unique: str
) -> None:
    """Two passes at once over 150 keys (two pages): each key moved once, no follower lost."""
    store, topic = store_of(redis, unique)
    keys = [f"{i:04d}".encode() * (LONG // 4) for i in range(150)]
    heads = []
    for i, raw in enumerate(keys):
        heads.append(await park(store, topic, earlier_name(raw), raw, 10 * i, followers=1))
    prefix = f"t{unique}"
    other = Redis.from_url(redis_service)  # a member of its own
    try:
        moved = await asyncio.gather(
            rename_long_parked(redis, prefix, [store.lane]),
            rename_long_parked(other, prefix, [store.lane]),
        )
    finally:
        await other.aclose()
    assert sum(moved) == len(keys)
    assert sorted(await redis.hkeys(store.keys.parked)) == sorted(
        encode_key(raw).encode() for raw in keys
    )
    for raw, (head, held) in zip(keys, heads, strict=True):
        assert await finish_head(store, topic, head, raw) == held


async def test_a_key_parked_under_both_names_is_left_and_moved_once_the_current_one_is_released(
    redis: Redis, unique: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Both names parked: a warning naming the digest; a later start moves the earlier state.

    The earlier release parked head A with follower A1; this release, not seeing it, parked the
    same key again with head B, and A's copy came back and was held behind B. Once B's state is
    released (A's copy ran among it), a start moves A's state; A having finished, its follower
    is the head, released by the lane's next reap.
    """
    store, topic = store_of(redis, unique)
    raw = b"b" * LONG
    old_head, old_held = await park(store, topic, earlier_name(raw), raw, 0, followers=1)
    new_head, _ = await park(store, topic, encode_key(raw), raw, 10, followers=0)
    prefix = f"t{unique}"
    with caplog.at_level(logging.INFO, logger="pipeline.retry.rename_long_keys"):
        assert await rename_long_parked(redis, prefix, [store.lane]) == 0
    [line] = [r.getMessage() for r in caplog.records]
    assert line.startswith(
        f"parked key {encode_key(raw)} of lane {store.lane} is parked under both"
    )
    assert await redis.hlen(store.keys.parked) == 2
    # A's copy comes back: held behind B. B's copy succeeds and releases it; it runs and ends.
    a_copy = Start(
        old_head.ident, encode_key(raw), f"{topic}.retry.1s:0:1", ordered=True, attempt=2
    )
    message = Message(f"{topic}.retry.1s", 0, 1, raw, b"a")
    assert await store.begin_parked(message, a_copy) == ("held", 0)
    assert await finish_head(store, topic, new_head, raw) == [old_head.ident]
    a_ran = Start(old_head.ident, encode_key(raw), "rel", ordered=True, attempt=0)
    assert await store.end_many([KeyEnds([(a_ran, "done")], follow_dead=False)]) == [[]]
    assert await redis.hkeys(store.keys.parked) == [earlier_name(raw).encode()]
    # The next start moves A's state; the next reap releases A1, now its head.
    assert await rename_long_parked(redis, prefix, [store.lane]) == 1
    released = await store.reap()
    assert [(r.key, r.ident) for r in released] == [(encode_key(raw), old_held[0])]


async def test_a_redis_out_of_reach_is_a_warning_not_a_failed_start(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Nothing answers: one warning naming the lanes, and the start goes on."""
    unreachable = Redis(host="127.0.0.1", port=1, retry=Retry(NoBackoff(), 0))
    try:
        with caplog.at_level(logging.WARNING, logger="pipeline.retry.rename_long_keys"):
            assert await rename_long_parked(unreachable, "tnone", ["a", "b"]) == 0
    finally:
        await unreachable.aclose()
    [line] = [r.getMessage() for r in caplog.records]
    assert line.startswith(
        "could not move keys parked under an earlier release's names on lanes a, b"
    )


async def test_pipeline_consume_moves_them_at_start(tmp_path: Path, unique: str) -> None:
    """`pipeline consume` of an ordered lane with a tier moves them before it consumes."""
    lane = f"start_{unique}"
    spec = lane_spec(lane, 1, retry={"tiers": ["1s"]})
    raw = b"s" * LONG
    with private_redis("--save", "") as url:
        client = Redis.from_url(url)
        try:
            store = lane_guards(client, "pl", [spec])[spec.lane]  # the default prefix
            _, held = await park(store, lane, earlier_name(raw), raw, 0, followers=1)
            lines = await consume_until_logged(tmp_path, lane, url, "moved 1 parked keys")
            assert "INFO" in the_line(lines, f"moved 1 parked keys of lane {lane}")
            assert await client.hkeys(store.keys.parked) == [encode_key(raw).encode()]
            _, _, followers = store.keys.of_key(encode_key(raw))
            assert await client.hkeys(followers) == [held[0].encode()]
        finally:
            await client.aclose()
