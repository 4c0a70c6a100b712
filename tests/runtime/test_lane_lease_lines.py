"""The line a stopping member logs when it cannot give its lane leases up.

Before, a member whose Redis was never reachable said at its stop that the lease "ends 30 s
after group 'g''s last renewal": there had been no renewal, and the doubled quote read oddly.
Now a member that never held the lease says so (nothing to give up), and one that held it says
that its hold runs out by itself, counted from its own last renewal.
"""

from __future__ import annotations

import asyncio
import logging
import re

import pytest
from private_redis import bare_client
from redis.asyncio import Redis

from pipeline.runtime.lane_lease import LaneLease
from pipeline.testing.ports import free_port

LEASE = "pipeline.runtime.lane_lease"


def _lines(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [record for record in caplog.records if record.name == LEASE]


async def test_a_member_whose_redis_was_never_reachable_says_it_held_nothing(
    prefix: str, unique: str, caplog: pytest.LogCaptureFixture
) -> None:
    """No Redis listens: the start goes on, and the stop says no lease was ever held."""
    caplog.set_level(logging.INFO, logger=LEASE)
    port = free_port()
    client = Redis.from_url(f"redis://127.0.0.1:{port}/0")
    try:
        lease = LaneLease(client, prefix, [f"a_{unique}"], "g", lease_ms=30_000, check_s=0.05)
        assert await lease.wait(asyncio.Event())
        caplog.clear()
        await lease.leave()
    finally:
        await client.aclose()
    (line,) = _lines(caplog)
    message = line.getMessage()
    assert line.levelno == logging.INFO
    assert message.startswith(f"group 'g' never held the lease of lane(s) 'a_{unique}'")
    assert f"127.0.0.1:{port}" in message
    assert "in this member: nothing to give up (Redis redis://127.0.0.1:" in message
    assert "renewal" not in message
    assert "''" not in message


async def test_a_member_that_held_its_lease_says_when_its_hold_runs_out(
    prefix: str, unique: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Held, then Redis stops: the stop's one warning counts from this member's renewal."""
    caplog.set_level(logging.INFO, logger=LEASE)
    async with bare_client() as (server, client):
        lease = LaneLease(client, prefix, [f"a_{unique}"], "g", lease_ms=30_000, check_s=0.05)
        assert await lease.wait(asyncio.Event())
        server.stop()
        caplog.clear()
        await lease.leave()
    (line,) = _lines(caplog)
    message = line.getMessage()
    assert line.levelno == logging.WARNING
    assert message.startswith(
        f"could not give up the lease of lane(s) 'a_{unique}' held for group 'g' in Redis"
        f" redis://127.0.0.1:{server.port}/0 ("
    )
    assert re.search(r"this member's hold ends 30 s after its last renewal \(\d+ s ago\)", message)
    assert "never held" not in message
    assert "''" not in message
