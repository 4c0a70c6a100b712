"""The run guard's lane-wide marks through an outage of every member longer than the retry path.

The start marks (``T:run``) and lone-start counts (``T:alone``) are renewed by every member's
reap tick (about every 2 s), so their expiry only counts while the whole fleet is down. These
tests take the fleet down past the retry path plus an hour (the guard's short bound,
``ttl_ms``) at the moments a mark matters, and bring it back with a new member process:

* a start that failed and produced its retry copy, its member killed before committing the
  failed delivery's offset ("0|position|attempt"): that delivery, read again, is stale;
* a message whose member died mid-run ("1|position"), and its lone starts as a suspect: read
  again it runs as a suspect, and each crash counts towards ``poison_after``;
* a parked key's head whose copy succeeded, its tier offset not committed (``T:gone``).

Time is moved on in Redis instead of waited for (:func:`outage`). The guard is driven through
:class:`GuardStore` as a member drives it, against the real Redis.
"""

from __future__ import annotations

from redis.asyncio import Redis
from runtime.helpers import lane_spec
from support import pass_expiries

from pipeline.envelope import Message
from pipeline.retry.guard_store import Decision, GuardStore, KeyEnds, Start, lane_guards
from pipeline.retry.held import encode_held
from pipeline.retry.keys import encode_key
from pipeline.topics.spec import TopicSpec

KEY = encode_key(b"k")


def guard(redis: Redis, unique: str, spec: TopicSpec) -> GuardStore:
    """A member process's guard store of ``spec``'s lane, with ``pipeline consume``'s bounds."""
    return lane_guards(redis, f"t{unique}", [spec])[spec.lane]


async def outage(redis: Redis, store: GuardStore) -> None:
    """Every member goes down for the retry path plus an hour and a minute, by Redis's clock.

    The members' last reap tick runs first (it renews the lane's expiry, about every 2 s); then
    the time passes as :func:`pass_time` has it.
    """
    await store.reap()
    duration_ms = store.ttl_ms + 60_000
    assert duration_ms < store.hold_ms  # the parked keys' state outlives it
    await pass_time(redis, store, duration_ms)


async def pass_time(redis: Redis, store: GuardStore, duration_ms: int) -> None:
    """``duration_ms`` pass by Redis's clock, with nothing written to the lane meanwhile.

    The lane's keys whose expiry falls within are removed and the others' shortened, and the
    times kept in Redis's clock (when a message left its parked key, a release's lease, the
    lane's last reap) grow as old.
    """
    for zset in (store.keys.gone, store.keys.releases):
        aged = {
            m: s - duration_ms
            for m, s in await redis.zrange(zset, 0, -1, withscores=True)
            if m != b"@off"  # a length of time, not a time (guard.lua)
        }
        if aged:
            await redis.zadd(zset, aged, xx=True)  # type: ignore[arg-type]
    await pass_expiries(redis, f"{store.keys.tag}*", duration_ms)


async def start_of(store: GuardStore, start: Start, message: Message | None = None) -> Decision:
    """What a member does with ``start``: ``gd_begin``, then ``gd_key_begin`` if it says slow.

    ``message``: the start's message, sent (as a member does on a key it knows to be parked)
    to be held behind the key's head.
    """
    if message is not None:
        start.body = encode_held(message)
    [(decision, _)] = await store.begin_many([], [start])
    if decision == "slow":
        assert message is not None
        decision, _ = await store.begin_parked(message, start)
    return decision


def plain_lane(unique: str) -> TopicSpec:
    """A lane without ordered retries, tiers of 5 s and a minute."""
    return lane_spec(f"plain_{unique}", 1, ordered=False, retry={"tiers": ["5s", "1m"]})


def ordered_lane(unique: str) -> TopicSpec:
    """An ordered lane, tiers of 5 s and a minute."""
    return lane_spec(f"ordered_{unique}", 1, retry={"tiers": ["5s", "1m"]})


async def test_a_failed_delivery_read_again_after_an_outage_does_not_run_beside_its_retry_copy(
    redis: Redis, unique: str
) -> None:
    """The delivery a retry copy replaces is stale after the outage: the message succeeds once."""
    spec = plain_lane(unique)
    store = guard(redis, unique, spec)
    first = Start(f"{spec.name}:0:7", KEY, f"{spec.name}:0:7", ordered=False)
    assert await start_of(store, first) == "process"
    # It fails: its retry copy is produced, its end recorded; the member is killed before it
    # commits the offset, so the failed delivery is read again when the fleet comes back.
    assert await store.route(first, 2, park=False)
    await store.begin_many([first.end_line + "\t1"], [])
    await outage(redis, store)
    back = guard(redis, unique, spec)
    copy = Start(first.ident, KEY, f"{spec.name}.retry.5s:0:3", ordered=False, attempt=2)
    ran: list[str] = []
    for start in (first, copy):  # the main partition's backlog starts with the failed delivery
        if await start_of(back, start) == "process":
            ran.append(start.position)  # it succeeds
            await back.begin_many([start.end_line], [])
    assert ran == [copy.position], "the message ran twice: its failed delivery ran again"


async def test_a_failed_head_read_again_after_an_outage_runs_once_before_its_follower(
    redis: Redis, unique: str
) -> None:
    """A parked key's failed delivery read again after the outage: head once, follower after."""
    spec = ordered_lane(unique)
    store = guard(redis, unique, spec)
    first = Start(f"{spec.name}:0:0", KEY, f"{spec.name}:0:0", ordered=True)
    follower = Start(f"{spec.name}:0:1", KEY, f"{spec.name}:0:1", ordered=True)
    assert await start_of(store, first) == "process"
    assert await store.route(first, 2, park=True)
    assert await start_of(store, follower, Message(spec.name, 0, 1, b"k", b"v")) == "held"
    await store.begin_many([first.end_line + "\t1"], [])
    await outage(redis, store)
    back = guard(redis, unique, spec)
    copy = Start(first.ident, KEY, f"{spec.name}.retry.5s:0:3", ordered=True, attempt=2)
    ran: list[str] = []
    for start in (first, copy):
        decision = await start_of(back, start, Message(spec.name, 0, 0, b"k", b"v"))
        if decision in ("process", "head"):
            ran.append(start.ident)
            [released] = await back.end_many([KeyEnds([(start, "done")], follow_dead=False)])
            for release in released:
                assert release.decision == "process"
                ran.append(release.ident)
                rel = Start(release.ident, KEY, "rel", ordered=True, attempt=0)
                assert await back.end_many([KeyEnds([(rel, "done")], follow_dead=False)]) == [[]]
    assert ran == [first.ident, follower.ident]
    assert await back.parked_count() == 0


async def test_a_crash_before_an_outage_counts_towards_poison_after(
    redis: Redis, unique: str
) -> None:
    """A message that kills its member, the fleet down past the bound after each crash: poison.

    Each outage ends with a new member process, which reads the message again (its offset was
    never committed). Its crashes count as they do without the outages: its first start, then
    its lone starts as a suspect, dead-lettered as poison once they reach ``poison_after``.
    """
    spec = plain_lane(unique)
    poison_after = spec.retry.poison_after
    store = guard(redis, unique, spec)
    start = Start(f"{spec.name}:0:0", KEY, f"{spec.name}:0:0", ordered=False)
    crashes = 0
    for _ in range(poison_after + 3):
        decision = await start_of(store, start)
        if decision == "suspect":
            verdict, _ = await store.solo(start, poison_after=poison_after)
            if verdict == "poison":
                break
            assert verdict == "process"
        else:
            assert decision == "process"
        crashes += 1  # its member dies mid-run: no end is recorded
        await outage(redis, store)
        store = guard(redis, unique, spec)
    else:
        raise AssertionError(f"still not poison after {crashes} crashes: it would crash for ever")
    assert crashes == poison_after


async def test_a_heads_copy_read_again_after_an_outage_does_not_run_after_its_followers(
    redis: Redis, unique: str
) -> None:
    """A head's copy that succeeded, read again after the outage: stale, never run again.

    Its member ran the head's copy and the follower released to it, and was killed before it
    committed the copy's offset in its tier.
    """
    spec = ordered_lane(unique)
    store = guard(redis, unique, spec)
    first = Start(f"{spec.name}:0:0", KEY, f"{spec.name}:0:0", ordered=True)
    follower = Start(f"{spec.name}:0:1", KEY, f"{spec.name}:0:1", ordered=True)
    later = Start(f"{spec.name}:0:2", KEY, f"{spec.name}:0:2", ordered=True)
    assert await start_of(store, first) == "process"
    assert await store.route(first, 2, park=True)
    await store.begin_many([first.end_line + "\t1"], [])
    for held in (follower, later):
        message = Message(spec.name, 0, int(held.ident.rsplit(":", 1)[1]), b"k", b"v")
        assert await start_of(store, held, message) == "held"
    copy = Start(first.ident, KEY, f"{spec.name}.retry.5s:0:3", ordered=True, attempt=2)
    assert await start_of(store, copy) == "head"
    [released] = await store.end_many([KeyEnds([(copy, "done")], follow_dead=False)])
    assert [r.ident for r in released] == [follower.ident, later.ident]
    # The follower ran; its member is killed while `later` runs (the release's lease lapses).
    rel = Start(follower.ident, KEY, "rel", ordered=True, attempt=0)
    await store.end_many([KeyEnds([(rel, "done")], follow_dead=False, release=False)])
    await outage(redis, store)
    back = guard(redis, unique, spec)
    # The returning member's reap tick takes the release over; the copy is read meanwhile.
    ran: list[str] = []
    for release in await back.reap():
        ran.append(release.ident)
        rel = Start(release.ident, KEY, "rel", ordered=True, attempt=0)
        [more] = await back.end_many([KeyEnds([(rel, "done")], follow_dead=False)])
        ran += [r.ident for r in more]
    decision = await start_of(back, copy, Message(spec.name, 0, 0, b"k", b"v"))
    if decision in ("process", "head"):
        ran.append(copy.ident)
    ran += [r.ident for r in await back.reap()]
    assert ran == [later.ident], "the head ran again, after its followers"
    assert decision == "stale"


async def test_finished_ids_older_than_the_retry_path_are_pruned_while_members_run(
    redis: Redis, unique: str
) -> None:
    """The lane's clock stands still only through an outage: with members up, ids age out."""
    spec = ordered_lane(unique)
    store = guard(redis, unique, spec)
    first = Start(f"{spec.name}:0:0", KEY, f"{spec.name}:0:0", ordered=True)
    assert await start_of(store, first) == "process"
    assert await store.route(first, 2, park=True)
    await store.begin_many([first.end_line + "\t1"], [])
    copy = Start(first.ident, KEY, f"{spec.name}.retry.5s:0:3", ordered=True, attempt=2)
    assert await start_of(store, copy) == "head"
    assert await store.end_many([KeyEnds([(copy, "done")], follow_dead=False)]) == [[]]
    await store.reap()  # the members' reap ticks go on
    left = await redis.zscore(store.keys.gone, first.ident)
    assert left is not None
    # It left the retry path plus an hour ago, every member up meanwhile.
    await redis.zadd(store.keys.gone, {first.ident: left - store.ttl_ms - 1}, xx=True)
    await store.reap()
    assert await redis.zscore(store.keys.gone, first.ident) is None
    # Forgotten: a copy read this late would run.
    assert await start_of(store, copy, Message(spec.name, 0, 0, b"k", b"v")) == "process"
