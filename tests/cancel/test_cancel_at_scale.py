"""Standing cancellations at scale: a transition and a member's reread cost what changed."""

from __future__ import annotations

import json

from redis.asyncio import Redis

from pipeline.cancel import Target, cancel
from pipeline.cancel.functions import CancelFunctions
from pipeline.cancel.keys import CancelKeys

T0_MS = 1_700_000_000_000
PRUNED_PER_CANCEL = 1_000
"""``cancel.lua``'s bound on the expired selectors one transition removes."""
CHANGES_KEPT = 10_000
"""``cancel.lua``'s bound on the changes kept for members to catch up from."""


async def _cancel_keys(redis: Redis, prefix: str, n: int, *, keep_ms: int, now_ms: int) -> None:
    """``n`` key cancellations (``k0`` ...), in one pipeline of ``cn_cancel`` calls."""
    functions = CancelFunctions(redis, prefix)
    await functions.ensure_loaded()
    k = functions.keys
    keys = [k.selectors, k.version, k.runs, k.stops, k.until, k.changes, k.meta]
    pipe = redis.pipeline(transaction=False)
    for i in range(n):
        args = ["key", "*", f"k{i}", "r", now_ms, keep_ms]
        pipe.fcall(functions.name("cn_cancel"), len(keys), *keys, *args)
    await pipe.execute()


def _entry(until_ms: int) -> str:
    return json.dumps({"at": T0_MS, "reason": "r", "until": until_ms})


async def test_a_member_rereads_only_the_cancellations_that_changed(
    redis: Redis, prefix: str
) -> None:
    """After one more cancellation a member reads that one selector, not every standing one."""
    for i in range(500):
        await cancel(redis, prefix, Target("key", f"k{i}"), now_ms=T0_MS)
    member = CancelFunctions(redis, prefix)
    await member.selectors()
    assert member.entries_read == 500
    await cancel(redis, prefix, Target("tenant", "acme", "lane"), "gone", now_ms=T0_MS + 1)
    version, entries = await member.selectors()
    assert member.entries_read == 501
    assert entries["tenant:lane:acme"]["reason"] == "gone"
    assert (version, entries) == await CancelFunctions(redis, prefix).selectors()


async def test_pruning_removes_expired_cancellations_a_bounded_number_per_transition(
    redis: Redis, prefix: str
) -> None:
    """A transition removes at most 1,000 expired selectors, and members drop just those."""
    keys = CancelKeys(prefix)
    for i in range(PRUNED_PER_CANCEL + 200):
        await cancel(redis, prefix, Target("key", f"k{i}"), keep_ms=1_000, now_ms=T0_MS)
    await cancel(redis, prefix, Target("key", "lasting"), now_ms=T0_MS)
    member = CancelFunctions(redis, prefix)
    await member.selectors()
    later = T0_MS + 5_000
    await cancel(redis, prefix, Target("key", "fresh"), now_ms=later)
    assert await redis.hlen(keys.selectors) == 200 + 2
    await cancel(redis, prefix, Target("key", "fresher"), now_ms=later)
    assert await redis.hlen(keys.selectors) == 3
    _, entries = await member.selectors()
    assert sorted(entries) == ["key:*:fresh", "key:*:fresher", "key:*:lasting"]


async def test_cancellations_recorded_before_the_index_existed_still_expire(
    redis: Redis, prefix: str
) -> None:
    """Selectors an earlier release wrote, with no end-time index, are indexed and expire."""
    keys = CancelKeys(prefix)
    old = {f"key:*:old{i}": _entry(T0_MS + 1_000) for i in range(1_500)}
    old["key:*:standing"] = _entry(T0_MS + 60_000)
    await redis.hset(keys.selectors, mapping=old)
    await redis.set(keys.version, 7)
    later = T0_MS + 5_000
    for i in range(20):  # a bounded step of the index and of the pruning per transition
        await cancel(redis, prefix, Target("key", f"new{i}"), now_ms=later)
        if await redis.hlen(keys.selectors) == i + 2:
            break
    fields = sorted(f.decode() for f in await redis.hkeys(keys.selectors))
    assert fields == sorted(["key:*:standing", *(f"key:*:new{j}" for j in range(i + 1))])
    assert i < 19


async def test_a_transition_of_an_earlier_release_makes_members_read_everything(
    redis: Redis, prefix: str
) -> None:
    """A version bump the change log does not account for makes a member reread every selector."""
    keys = CancelKeys(prefix)
    await cancel(redis, prefix, Target("key", "a"), now_ms=T0_MS)
    member = CancelFunctions(redis, prefix)
    await member.selectors()
    await redis.hset(keys.selectors, "key:*:b", _entry(T0_MS + 60_000))  # as cn_cancel did
    await redis.incr(keys.version)
    _, entries = await member.selectors()
    assert sorted(entries) == ["key:*:a", "key:*:b"]
    await cancel(redis, prefix, Target("key", "c"), now_ms=T0_MS)
    _, entries = await member.selectors()
    assert sorted(entries) == ["key:*:a", "key:*:b", "key:*:c"]


async def test_a_member_behind_the_kept_changes_reads_everything(redis: Redis, prefix: str) -> None:
    """A member more changes behind than Redis keeps reads every selector again, missing none."""
    await cancel(redis, prefix, Target("key", "first"), now_ms=T0_MS)
    member = CancelFunctions(redis, prefix)
    await member.selectors()
    await cancel(redis, prefix, Target("key", "second"), now_ms=T0_MS)
    await _cancel_keys(redis, prefix, CHANGES_KEPT, keep_ms=60_000, now_ms=T0_MS)
    read = member.entries_read
    _, entries = await member.selectors()
    assert member.entries_read - read == CHANGES_KEPT + 2  # all of them, in one full read
    assert {"key:*:first", "key:*:second", "key:*:k0"} <= set(entries)
    assert len(entries) == CHANGES_KEPT + 2
