"""The marker's field per group: an upgraded marker, and members that name no group, page no one.

A marker the previous release wrote has no group's field: a member of this release finding its
group's field missing there must not take it for a loss (nothing was lost: the marker is
there). Nor must a group whose member wrote the marker without naming its group. A marker this
release wrote after a loss keeps every group's field, and each group that consumed before is
reported once, at its first start.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

import pytest
from redis.asyncio import Redis
from runtime.consumed_lane import consumed_lane
from runtime.helpers import CountingAdmin, idle_lane
from runtime.private_redis import bare_client

from pipeline.config import Settings
from pipeline.runtime.app import Lane
from pipeline.runtime.state_loss import StateWatch, group_field, mark_present, marker_key
from pipeline.transport import create_transport

LOGGER = "pipeline.runtime.state_loss"


async def previous_release_look(client: Redis, prefix: str) -> None:
    """The look of the previous release: an epoch written if missing, the count raised."""
    async with client.pipeline(transaction=True) as pipe:
        pipe.hsetnx(marker_key(prefix), "epoch", "0123456789abcdef")
        pipe.hincrby(marker_key(prefix), "count", 1)
        pipe.hget(marker_key(prefix), "epoch")
        await pipe.execute()


async def two_consumed_groups(settings: Settings, unique: str) -> dict[str, Lane]:
    """Groups A and B, each with committed offsets on an ordered lane with a tier of its own."""
    lanes = {f"ga-{unique}": f"ua_{unique}", f"gb-{unique}": f"ub_{unique}"}
    out = {}
    for group, name in lanes.items():
        lane = idle_lane(name, retry={"tiers": ["1h"]})
        await consumed_lane(settings, lane.spec, group)
        out[group] = lane
    return out


@asynccontextmanager
async def two_groups_on_a_private_redis(
    settings: Settings, unique: str
) -> AsyncIterator[tuple[dict[str, Lane], CountingAdmin, str, Redis]]:
    """Groups A and B (:func:`two_consumed_groups`) and a private Redis of their members.

    Yields their lanes by group, the broker's admin client counting its lag reads, the
    Redis's URL and a client of it; the Redis is stopped and the broker's client closed at the
    end.
    """
    lanes = await two_consumed_groups(settings, unique)
    transport = create_transport(settings, "kafka")
    try:
        admin = CountingAdmin(transport.admin())
        async with bare_client() as (server, client):
            yield lanes, admin, server.url, client
    finally:
        await transport.close()


async def starts(
    client: Redis, url: str, prefix: str, lanes: dict[str, Lane], admin: CountingAdmin
) -> list[bool]:
    """One member of each group starts, in order; whether each reported a loss."""
    return [
        await StateWatch(
            client, url, prefix, group, [lane], admin=admin, consumed_timeout_s=60
        ).start()
        for group, lane in lanes.items()
    ]


def logged(caplog: pytest.LogCaptureFixture) -> Sequence[str]:
    """The lines the watches logged."""
    return [r.getMessage() for r in caplog.records if r.name == LOGGER]


async def test_an_upgraded_marker_pages_no_one_and_a_later_loss_every_group(
    settings: Settings, kafka_service: str, unique: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Previous release's marker: silent, broker not asked; FLUSHALL after: A and B each once."""
    prefix = f"t{unique}"
    async with two_groups_on_a_private_redis(settings, unique) as (lanes, admin, url, client):
        await previous_release_look(client, prefix)
        with caplog.at_level(logging.DEBUG, logger=LOGGER):
            assert await starts(client, url, prefix, lanes, admin) == [False, False]
            assert admin.calls == 0  # the group's field missing there tells nothing
            assert logged(caplog) == []
            await client.flushall()  # no member runs
            assert await starts(client, url, prefix, lanes, admin) == [True, True]
            assert admin.calls == 2
            # Restarted: each group's field is there now.
            assert await starts(client, url, prefix, lanes, admin) == [False, False]
        assert admin.calls == 2
        for group in lanes:
            assert await client.hexists(marker_key(prefix), group_field(group))
    first, second = logged(caplog)
    group_a, group_b = lanes
    assert f"holds no state-loss marker {marker_key(prefix)} although group {group_a}" in first
    assert (
        f"has no entry for group {group_b} in its state-loss marker {marker_key(prefix)}" in second
    )
    assert f"although group {group_b} has consumed {lanes[group_b].name} before" in second
    assert f"Only the first member of group {group_b} to start reports this." in second


async def test_a_loss_seen_while_running_is_not_reported_again_at_the_next_start(
    settings: Settings, kafka_service: str, unique: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A and B run through a FLUSHALL (each reports it), then restart: nothing more."""
    prefix = f"t{unique}"
    async with two_groups_on_a_private_redis(settings, unique) as (lanes, admin, url, client):
        await starts(client, url, prefix, lanes, admin)  # a new Redis: reported
        caplog.clear()
        running = [StateWatch(client, url, prefix, g, [x]) for g, x in lanes.items()]
        for watch in running:
            await watch.start()
        await client.flushall()
        with caplog.at_level(logging.DEBUG, logger=LOGGER):
            assert [await watch.check() for watch in running] == [True, True]
            calls = admin.calls
            assert await starts(client, url, prefix, lanes, admin) == [False, False]
        assert admin.calls == calls
    assert len(logged(caplog)) == 2  # the two running members' lines only


async def test_members_naming_or_not_their_group_page_no_one(
    settings: Settings, kafka_service: str, unique: str, caplog: pytest.LogCaptureFixture
) -> None:
    """B's member kept no watch: with its group named, its field is there; without, untracked."""
    prefix = f"t{unique}"
    async with two_groups_on_a_private_redis(settings, unique) as (lanes, admin, url, client):
        (group_a, lane_a), (group_b, lane_b) = lanes.items()
        for named in (True, False):
            await client.flushall()
            first = StateWatch(client, url, prefix, group_a, [lane_a])
            await first.start()  # a member of A wrote the marker anew
            await mark_present(client, url, prefix, group_b if named else None)
            watch = StateWatch(client, url, prefix, group_b, [lane_b], admin=admin)
            with caplog.at_level(logging.DEBUG, logger=LOGGER):
                assert await watch.start() is False
    assert admin.calls == 0
    assert logged(caplog) == []


@pytest.mark.parametrize("previous_first", [False, True])
async def test_a_member_of_the_previous_release_beside_this_one_pages_no_one(
    settings: Settings,
    kafka_service: str,
    unique: str,
    caplog: pytest.LogCaptureFixture,
    previous_first: bool,
) -> None:
    """A rolling update: a member of B of the previous release beside A's of this one.

    It looks at the marker A's member wrote anew (or writes it, then A's looks): B's first
    member of this release must not take B's field missing for a loss, nor ask the broker
    (B's members ran all along).
    """
    prefix = f"t{unique}"
    async with two_groups_on_a_private_redis(settings, unique) as (lanes, admin, url, client):
        (group_a, lane_a), (group_b, lane_b) = lanes.items()
        await client.flushall()  # a loss while they ran: written anew by one of them
        if previous_first:
            await previous_release_look(client, prefix)
        await StateWatch(client, url, prefix, group_a, [lane_a]).start()
        await previous_release_look(client, prefix)  # B's member of the previous release
        watch = StateWatch(
            client, url, prefix, group_b, [lane_b], admin=admin, consumed_timeout_s=60
        )
        with caplog.at_level(logging.DEBUG, logger=LOGGER):
            assert await watch.start() is False
    assert admin.calls == 0
    assert logged(caplog) == []


# Each combination: what this release's members say. The running members start A's first, then
# B's; "mixed": B's is of the previous release (47c84dd), its looks naming no group.
# (origin, members, loss) -> (pages at the running members of this release's starts, at their
# checks, at the starts after: A's then B's first member of this release).
MATRIX = {
    # A fresh Redis under groups that consumed is a new Redis: the first member of each says so.
    ("fresh", "this", "none"): ([True, True], [False, False], [False, False]),
    ("fresh", "this", "running"): ([True, True], [True, True], [False, False]),
    ("fresh", "this", "stopped"): ([True, True], None, [True, True]),
    # B's previous-release member says the new Redis itself (it wrote nothing of B's).
    ("fresh", "mixed", "none"): ([True], [False], [False, False]),
    ("fresh", "mixed", "running"): ([True], [True], [False, False]),
    # A loss while none ran, B's member of the previous release starting after A's: B's is
    # missed, as 47c84dd misses it (that member finds the marker there, and its look leaves the
    # marker untracked). Starting first, it says B's loss itself, and A's is missed (as by
    # 47c84dd: the marker is there). A look of the previous release names no group, so
    # untracked is all this release can take it for.
    ("fresh", "mixed", "stopped"): ([True], None, [True, False]),
    ("fresh", "mixed", "stopped, previous first"): ([True], None, [False, False]),
    ("previous", "this", "none"): ([False, False], [False, False], [False, False]),
    ("previous", "this", "running"): ([False, False], [True, True], [False, False]),
    ("previous", "this", "stopped"): ([False, False], None, [True, True]),
    ("previous", "mixed", "none"): ([False], [False], [False, False]),
    ("previous", "mixed", "running"): ([False], [True], [False, False]),
    ("previous", "mixed", "stopped"): ([False], None, [True, False]),
    ("previous", "mixed", "stopped, previous first"): ([False], None, [False, False]),
    ("this", "this", "none"): ([False, False], [False, False], [False, False]),
    ("this", "this", "running"): ([False, False], [True, True], [False, False]),
    ("this", "this", "stopped"): ([False, False], None, [True, True]),
    ("this", "mixed", "none"): ([False], [False], [False, False]),
    ("this", "mixed", "running"): ([False], [True], [False, False]),
    ("this", "mixed", "stopped"): ([False], None, [True, False]),
    ("this", "mixed", "stopped, previous first"): ([False], None, [False, False]),
}


class Mix:
    """The members of groups A and B on one private Redis, looking as each release looks."""

    def __init__(
        self, client: Redis, url: str, prefix: str, lanes: dict[str, Lane], admin: CountingAdmin
    ) -> None:
        """Members of ``lanes``' groups (A, then B) at marker prefix ``prefix``."""
        self.client, self.url, self.prefix, self.admin = client, url, prefix, admin
        (self.group_a, self.lane_a), (self.group_b, self.lane_b) = lanes.items()

    def watch(self, group: str, lane: Lane) -> StateWatch:
        """A member of this release of ``group``, asking the broker at its start."""
        return StateWatch(
            self.client,
            self.url,
            self.prefix,
            group,
            [lane],
            admin=self.admin,
            consumed_timeout_s=60,
        )

    async def previous(self) -> None:
        """A look of B's member of the previous release (at its start or its check)."""
        await previous_release_look(self.client, self.prefix)

    async def origin(self, origin: str) -> None:
        """The marker before the members start: none, the previous release's, or this one's."""
        if origin == "previous":
            await self.previous()
        elif origin == "this":
            for group in (self.group_a, self.group_b):
                await mark_present(self.client, self.url, self.prefix, group)

    async def starts_after(self, loss: str, mixed: bool) -> list[bool]:
        """Every member stopped, FLUSHALL, then the first member of A and of B start."""
        await self.client.flushall()
        if loss == "stopped, previous first":
            await self.previous()
        after = [await self.watch(self.group_a, self.lane_a).start()]
        if loss == "stopped" and mixed:
            await self.previous()
        after.append(await self.watch(self.group_b, self.lane_b).start())
        return after


@pytest.mark.parametrize(("origin", "members", "loss"), sorted(MATRIX))
async def test_every_marker_member_mix_and_loss_pages_as_it_should(
    settings: Settings,
    kafka_service: str,
    unique: str,
    caplog: pytest.LogCaptureFixture,
    origin: str,
    members: str,
    loss: str,
) -> None:
    """{no marker, 47c84dd's, this release's} x {this release only, B of 47c84dd} x loss.

    No false page: a restart without loss and the starts after a loss the running members saw
    page no one. A loss while none ran is paged for each group whose members are all of this
    release; one with a member of the previous release is left to it (its start finds the
    marker missing only if it is the first to start: beyond that, a miss as in 47c84dd).
    """
    mixed = members == "mixed"
    async with two_groups_on_a_private_redis(settings, unique) as (lanes, admin, url, client):
        mix = Mix(client, url, f"t{unique}", lanes, admin)
        await mix.origin(origin)
        running = [mix.watch(mix.group_a, mix.lane_a)]
        if not mixed:
            running.append(mix.watch(mix.group_b, mix.lane_b))
        started = []
        checked = None
        with caplog.at_level(logging.DEBUG, logger=LOGGER):
            for each in running:
                started.append(await each.start())
                if mixed:
                    await mix.previous()  # B's member's start
            if loss.startswith("stopped"):
                after = await mix.starts_after(loss, mixed)
            else:  # the running members look, then one more member of each group starts
                if loss == "running":
                    await client.flushall()
                checked = [await each.check() for each in running]
                if mixed:
                    await mix.previous()  # B's member's look
                after = [await mix.watch(g, lane).start() for g, lane in lanes.items()]
    expected = MATRIX[origin, members, loss]
    assert (started, checked, after) == expected
    assert len([r for r in caplog.records if r.levelno == logging.CRITICAL]) == sum(
        sum(pages or []) for pages in expected
    )
