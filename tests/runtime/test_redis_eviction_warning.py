"""`pipeline consume` warns at start when its Redis may evict held followers (maxmemory policy)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from ingress.redis_server import private_redis
from redis.asyncio import Redis
from runtime.helpers import consume_until_logged, idle_lane, the_line

from pipeline.runtime.eviction import warn_if_evicting


@pytest.fixture
def evicting_redis() -> Iterator[str]:
    """A private redis-server that evicts keys with an expiry when full (volatile-lru)."""
    with private_redis(
        *("--save", "", "--maxmemory", "100mb", "--maxmemory-policy", "volatile-lru")
    ) as url:
        yield url


async def test_consume_warns_once_when_its_redis_evicts_keys_with_an_expiry(
    evicting_redis: str, tmp_path: Path, unique: str
) -> None:
    """With maxmemory and volatile-lru: one WARNING line: the URL, the policy, the loss, the fix."""
    lane = f"evict_{unique}"
    lines = await consume_until_logged(tmp_path, lane, evicting_redis, "maxmemory-policy")
    line = the_line(lines, "maxmemory")
    assert "WARNING" in line
    assert evicting_redis in line
    assert "volatile-lru" in line
    assert f"held followers of parked keys (lanes {lane})" in line
    assert "set maxmemory-policy noeviction" in line


async def test_no_word_when_redis_refuses_config_or_never_evicts(
    unique: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A Redis refusing CONFIG (as managed ones do), or one set to noeviction: nothing logged."""
    lanes = [idle_lane(f"quiet_{unique}", retry={"tiers": ["1s"]})]
    for options in (
        (
            "--maxmemory",
            "100mb",
            "--maxmemory-policy",
            "volatile-lru",
            *("--rename-command", "CONFIG", ""),
        ),
        ("--maxmemory", "100mb", "--maxmemory-policy", "noeviction"),
        ("--maxmemory", "0", "--maxmemory-policy", "allkeys-lru"),
    ):
        with private_redis("--save", "", *options) as url:
            client = Redis.from_url(url)
            try:
                with caplog.at_level(logging.WARNING, logger="pipeline.runtime.eviction"):
                    assert await warn_if_evicting(client, url, lanes) is None
            finally:
                await client.aclose()
    assert not caplog.records
