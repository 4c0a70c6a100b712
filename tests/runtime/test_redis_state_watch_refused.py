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

import pytest
from redis.asyncio import Redis
from runtime.helpers import lane_spec
from runtime.private_redis import bare_redis

from pipeline.runtime import App, Context
from pipeline.runtime.state_loss import StateWatch, marker_key

LOGGER = "pipeline.runtime.state_loss"


def _watch(client: Redis, url: str, prefix: str, name: str) -> StateWatch:
    app = App([lane_spec(name, 1, retry={"tiers": ["1s"]})])

    @app.handler(name)
    async def handle(event: bytes, ctx: Context) -> None:
        """Never called."""

    return StateWatch(client, url, prefix, "g-acl", [app.lanes[name]])


async def test_a_user_limited_to_the_pipelines_keys_sees_a_loss(
    unique: str, caplog: pytest.LogCaptureFixture
) -> None:
    """ACL ``~{PREFIX:*``: the marker is among its keys, and a FLUSHALL is one CRITICAL line."""
    prefix = f"t{unique}"
    with bare_redis() as server:
        admin = Redis.from_url(server.url)
        await admin.execute_command(
            "ACL", "SETUSER", "member", "on", ">pw", f"~{{{prefix}:*", "+@all"
        )
        url = f"redis://member:pw@127.0.0.1:{server.port}/0"
        client = Redis.from_url(url)
        try:
            watch = _watch(client, url, prefix, f"acl_{unique}")
            with caplog.at_level(logging.WARNING, logger=LOGGER):
                await watch.start()
                assert await watch.check() is False
                await admin.flushall()
                assert await watch.check() is True
        finally:
            await client.aclose()
            await admin.aclose()
    assert marker_key(prefix).startswith(f"{{{prefix}:")
    assert [r.levelno for r in caplog.records] == [logging.CRITICAL], caplog.text


async def test_a_refused_marker_is_one_warning(
    unique: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A user refused the marker's key: one WARNING naming it and the fix, not one per look."""
    prefix = f"t{unique}"
    with bare_redis() as server:
        admin = Redis.from_url(server.url)
        await admin.execute_command("ACL", "SETUSER", "member", "on", ">pw", "~other:*", "+@all")
        url = f"redis://member:pw@127.0.0.1:{server.port}/0"
        client = Redis.from_url(url)
        try:
            watch = _watch(client, url, prefix, f"acl_{unique}")
            with caplog.at_level(logging.WARNING, logger=LOGGER):
                await watch.start()
                assert [await watch.check() for _ in range(3)] == [False] * 3
        finally:
            await client.aclose()
            await admin.aclose()
    assert [r.levelno for r in caplog.records] == [logging.WARNING], caplog.text
    line = caplog.records[0].getMessage()
    assert marker_key(prefix) in line
    assert "NOPERM" in line or "permission" in line.lower()
    assert ":pw@" not in line  # the URL is printed without its password
    assert "unseen" in line
