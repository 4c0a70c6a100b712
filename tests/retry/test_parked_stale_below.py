"""A parked key's messages read again below where it was parked are stale, not held behind it.

A first delivery of a key not known to be parked runs unmarked: its end is implied by the
offset commit. When a later message of the key, read from the same main partition, parks the
key (it failed, or was sent away) and the member is killed before that commit, the earlier
message is read again. Held behind the head, it would run again after the head's copy: out of
order. The key's state keeps where it was parked (``topic:partition:offset``), and a delivery
from that partition below it, not in the key's parked set, is dropped as ``stale``.

The guard is driven through :class:`GuardStore` as a member drives it, against the real Redis.
"""

from __future__ import annotations

from redis.asyncio import Redis
from runtime.helpers import lane_spec

from pipeline.envelope import Message
from pipeline.retry.guard_store import Decision, GuardStore, KeyEnds, Start, lane_guards
from pipeline.retry.held import encode_held
from pipeline.retry.keys import encode_key
from pipeline.topics.spec import TopicSpec

KEY = encode_key(b"k")


def ordered_lane(unique: str) -> TopicSpec:
    """An ordered lane on two partitions, tiers of 5 s and a minute."""
    return lane_spec(f"below_{unique}", 2, retry={"tiers": ["5s", "1m"]})


def guard(redis: Redis, unique: str, spec: TopicSpec) -> GuardStore:
    """A member process's guard store of ``spec``'s lane, with ``pipeline consume``'s bounds."""
    return lane_guards(redis, f"t{unique}", [spec])[spec.lane]


def first(spec: TopicSpec, partition: int, offset: int) -> tuple[Start, Message]:
    """A first delivery of key ``k`` on the main topic, and its message."""
    at = f"{spec.name}:{partition}:{offset}"
    return Start(at, KEY, at, ordered=True), Message(spec.name, partition, offset, b"k", b"v")


async def decide(store: GuardStore, start: Start, message: Message, *, body: bool) -> Decision:
    """What a member does with ``start``: ``gd_begin``, then ``gd_key_begin`` if it says slow.

    ``body``: the member knows the key is parked and sends the message along (held at once).
    """
    start.body = encode_held(message) if body else None
    [(decision, _)] = await store.begin_many([], [start])
    if decision == "slow":
        decision, _ = await store.begin_parked(message, start)
    return decision


async def parked_by_the_second(redis: Redis, unique: str, spec: TopicSpec) -> GuardStore:
    """M1 (offset 10) ran unmarked and succeeded; M2 (offset 11) failed and parked the key.

    Then the member is killed before offset 10 is committed; returns a new member's store.
    """
    store = guard(redis, unique, spec)
    head, _ = first(spec, 0, 11)
    # M1 ran under the member's claim: no start mark, its end implied by the commit.
    head.below = head.position  # the member had finished every earlier message of the key
    assert await store.route(head, 2, park=True)
    await store.begin_many([head.end_line + "\t1"], [])  # its retry copy was produced
    return guard(redis, unique, spec)


async def test_an_earlier_message_read_again_below_the_parking_is_stale(
    redis: Redis, unique: str
) -> None:
    """M1 read again from the parking partition, below M2's offset, is dropped, not held."""
    spec = ordered_lane(unique)
    back = await parked_by_the_second(redis, unique, spec)
    again, message = first(spec, 0, 10)
    assert await decide(back, again, message, body=True) == "stale"
    assert await decide(back, again, message, body=False) == "stale"
    # The head itself, read again, is decided as before (its copy was produced: a copy).
    head, head_message = first(spec, 0, 11)
    assert await decide(back, head, head_message, body=True) == "copy"


async def test_later_messages_and_other_partitions_are_held_as_before(
    redis: Redis, unique: str
) -> None:
    """At or above the parking offset, or from another partition, a message waits behind."""
    spec = ordered_lane(unique)
    back = await parked_by_the_second(redis, unique, spec)
    later, message = first(spec, 0, 12)
    assert await decide(back, later, message, body=True) == "held"
    elsewhere, other = first(spec, 1, 3)
    assert await decide(back, elsewhere, other, body=False) == "held"
    # A held follower read again (its offset committed late) is its held copy, not stale.
    assert await decide(back, later, message, body=True) == "copy"


async def test_a_held_follower_below_the_parking_is_not_dropped(redis: Redis, unique: str) -> None:
    """A message in the key's parked set is never stale, whatever its offset."""
    spec = ordered_lane(unique)
    store = guard(redis, unique, spec)
    head, _ = first(spec, 0, 11)
    # Parked, in a member that still had M1 (offset 10) unfinished: the watermark is M1's.
    head.below = f"{spec.name}:0:10"
    assert await store.route(head, 2, park=True)
    earlier, message = first(spec, 0, 10)
    assert await decide(store, earlier, message, body=True) == "held"
    below, below_message = first(spec, 0, 9)
    assert await decide(store, below, below_message, body=True) == "stale"


async def test_the_mark_goes_with_the_keys_state(redis: Redis, unique: str) -> None:
    """Once the key has nothing parked, its state and the watermark are gone: M1 runs again."""
    spec = ordered_lane(unique)
    back = await parked_by_the_second(redis, unique, spec)
    copy = Start(f"{spec.name}:0:11", KEY, f"{spec.name}.retry.5s:0:0", ordered=True, attempt=2)
    [(decision, _)] = await back.begin_many([], [copy])
    assert decision == "head"
    assert await back.end_many([KeyEnds([(copy, "done")], follow_dead=False)]) == [[]]
    assert await back.parked_count() == 0
    assert not await redis.keys(f"{back.keys.tag}:h:*")
    again, message = first(spec, 0, 10)
    assert await decide(back, again, message, body=False) == "process"


async def test_parking_without_a_watermark_holds_as_before(redis: Redis, unique: str) -> None:
    """A key parked by a retry copy or a released follower keeps no watermark: all are held."""
    spec = ordered_lane(unique)
    store = guard(redis, unique, spec)
    head, _ = first(spec, 0, 11)
    assert await store.route(head, 2, park=True)
    again, message = first(spec, 0, 10)
    assert await decide(store, again, message, body=True) == "held"
