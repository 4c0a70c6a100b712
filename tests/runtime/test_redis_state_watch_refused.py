"""A member whose Redis refuses it the state-loss marker says so once, instead of nothing.

The marker's calls were quiet on every failure: a Redis out of reach (the runtime says so on
its own calls) and one that refuses them alike. A member whose ACL user may only use the
pipeline's hash-tagged keys (``~{PREFIX:*``) was refused the marker ``PREFIX:state-epoch`` at
start and at every look, at DEBUG: it could never see a loss, and nobody was told. The marker
is now ``{PREFIX:state}:marker``, in the key scheme of the others, and a refusal is one warning
line per run of refusals.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
from redis.asyncio import Redis
from runtime.helpers import idle_lane
from runtime.private_redis import bare_client

from pipeline.runtime.state_loss import StateWatch, marker_key

LOGGER = "pipeline.runtime.state_loss"


@asynccontextmanager
async def member_watch(
    prefix: str, lane: str, keys: str
) -> AsyncIterator[tuple[Redis, StateWatch]]:
    """A client of a private Redis as its default user, and a watch of user ``member``.

    ``member`` may use every command on the keys of the ACL pattern ``keys``; the watch (group
    ``g-acl``) is of one ordered lane with a retry tier.
    """
    async with bare_client() as (server, admin):
        await admin.execute_command("ACL", "SETUSER", "member", "on", ">pw", keys, "+@all")
        url = f"redis://member:pw@127.0.0.1:{server.port}/0"
        client = Redis.from_url(url)
        try:
            lanes = [idle_lane(lane, retry={"tiers": ["1s"]})]
            yield admin, StateWatch(client, url, prefix, "g-acl", lanes)
        finally:
            await client.aclose()


async def test_a_user_limited_to_the_pipelines_keys_sees_a_loss(
    unique: str, caplog: pytest.LogCaptureFixture
) -> None:
    """ACL ``~{PREFIX:*``: the marker is among its keys, and a FLUSHALL is one CRITICAL line."""
    prefix = f"t{unique}"
    async with member_watch(prefix, f"acl_{unique}", f"~{{{prefix}:*") as (admin, watch):
        with caplog.at_level(logging.WARNING, logger=LOGGER):
            await watch.start()
            assert await watch.check() is False
            await admin.flushall()
            assert await watch.check() is True
    assert marker_key(prefix).startswith(f"{{{prefix}:")
    assert [r.levelno for r in caplog.records] == [logging.CRITICAL], caplog.text


async def test_a_refused_marker_is_one_warning(
    unique: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A user refused the marker's key: one WARNING naming it and the fix, not one per look."""
    prefix = f"t{unique}"
    async with member_watch(prefix, f"acl_{unique}", "~other:*") as (_, watch):
        with caplog.at_level(logging.WARNING, logger=LOGGER):
            await watch.start()
            assert [await watch.check() for _ in range(3)] == [False] * 3
    assert [r.levelno for r in caplog.records] == [logging.WARNING], caplog.text
    line = caplog.records[0].getMessage()
    assert marker_key(prefix) in line
    assert "NOPERM" in line or "permission" in line.lower()
    assert ":pw@" not in line  # the URL is printed without its password
    assert "unseen" in line
