"""A parked key's release through outages: its followers are not overtaken, nor stranded.

A parked key's state (``T:z:K``, ``T:h:K``, ``T:f:K``) outlives an outage of every member as
long as the head's copy can come back from its tier (``test_held_outage.py``). Two lane-wide
keys index it: ``T:parked`` (the keys that have parked messages: a new message of a key found
there is held behind its head) and ``T:rel`` (the releases in progress: the reapers take over
the one whose member died). These tests release a key's followers across outages and check
that both indexes last as long as the state they point to:

* the fleet back after nearly the lane's retention, its release interrupted by a second
  outage: a new message of the key is still held behind the followers;
* a follower released and running for long (a day) while a new message of its key is held,
  its member then down with the fleet: the release is still taken over when they are back.

Time is moved on in Redis instead of waited for, as in ``test_marks_outage.py``.
"""

from __future__ import annotations

from redis.asyncio import Redis
from retry.test_marks_outage import guard, ordered_lane, pass_time, start_of

from pipeline.envelope import Message
from pipeline.retry.guard_store import Ending, GuardStore, KeyEnds, Start
from pipeline.retry.keys import encode_key

KEY = encode_key(b"k")
DAY_MS = 86_400_000


async def outage(redis: Redis, store: GuardStore, duration_ms: int) -> None:
    """Every member goes down for ``duration_ms``, after their last reap tick."""
    await store.reap()
    await pass_time(redis, store, duration_ms)


def main(spec_name: str, offset: int) -> tuple[Start, Message]:
    """A first delivery of key ``k`` at ``offset`` of the main topic: its start and message."""
    at = f"{spec_name}:0:{offset}"
    return Start(at, KEY, at, ordered=True), Message(spec_name, 0, offset, b"k", b"v")


async def parked_with(store: GuardStore, spec_name: str, followers: int) -> Start:
    """Key ``k``'s first message failed and parked it, ``followers`` held behind: its copy."""
    first, _ = main(spec_name, 0)
    assert await start_of(store, first) == "process"
    assert await store.route(first, 2, park=True)
    for offset in range(1, followers + 1):
        held, message = main(spec_name, offset)
        assert await start_of(store, held, message) == "held"
    await store.begin_many([first.end_line + "\t1"], [])
    return Start(first.ident, KEY, f"{spec_name}.retry.5s:0:3", ordered=True, attempt=2)


async def ran_on_reap(store: GuardStore) -> list[str]:
    """The releases ``store``'s reap tick takes over, run to the end: the ids that ran."""
    ran: list[str] = []
    for release in await store.reap():
        released = [release]
        while released:
            ran += [r.ident for r in released]
            ends: list[tuple[Start, Ending]] = [
                (Start(r.ident, KEY, "rel", ordered=True, attempt=0), "done") for r in released
            ]
            [released] = await store.end_many([KeyEnds(ends, follow_dead=False)])
    return ran


async def test_a_new_message_waits_behind_followers_whose_release_an_outage_interrupted(
    redis: Redis, unique: str
) -> None:
    """Back after nearly the retention, the release cut short by a second outage: order kept."""
    spec = ordered_lane(unique)
    store = guard(redis, unique, spec)
    copy = await parked_with(store, spec.name, 2)
    # Every member down until a minute before the head's copy leaves its tier.
    await outage(redis, store, store.hold_ms - store.ttl_ms - 60_000)
    back = guard(redis, unique, spec)
    assert await start_of(back, copy) == "head"
    [released] = await back.end_many([KeyEnds([(copy, "done")], follow_dead=False)])
    first, second = (r.ident for r in released)
    # The first follower ran; the member is killed while the second runs, the fleet with it.
    rel = Start(first, KEY, "rel", ordered=True, attempt=0)
    await back.end_many([KeyEnds([(rel, "done")], follow_dead=False, release=False)])
    await outage(redis, back, 2 * back.ttl_ms)
    again = guard(redis, unique, spec)
    ran: list[str] = []
    newer, message = main(spec.name, 3)  # the key's next message, read before the reap tick
    decision = await start_of(again, newer, message)
    if decision == "process":
        ran.append(newer.ident)
    ran += await ran_on_reap(again)
    assert ran == [second, newer.ident], "a new message of the key ran ahead of its followers"
    assert await again.parked_count() == 0


async def test_a_long_release_interrupted_by_an_outage_is_taken_over(
    redis: Redis, unique: str
) -> None:
    """A follower runs a day, a new message is held meanwhile; the fleet down: still released."""
    spec = ordered_lane(unique)
    store = guard(redis, unique, spec)
    copy = await parked_with(store, spec.name, 1)
    assert await start_of(store, copy) == "head"
    [[follower]] = await store.end_many([KeyEnds([(copy, "done")], follow_dead=False)])
    # It runs for a day, its member renewing the release's lease; a new message is held.
    await pass_time(redis, store, DAY_MS)
    await store.renew([KEY])
    newer, message = main(spec.name, 2)
    assert await start_of(store, newer, message) == "held"
    # The member dies; the fleet is down until a day before the held message would expire.
    await outage(redis, store, store.hold_ms - DAY_MS)
    back = guard(redis, unique, spec)
    assert await ran_on_reap(back) == [follower.ident, newer.ident], (
        "the release was never taken over: its followers wait until their key's state expires"
    )
    assert await back.parked_count() == 0
