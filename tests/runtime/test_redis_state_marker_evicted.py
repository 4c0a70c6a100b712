"""A marker evicted under memory pressure is reported as eviction, not only as a restart.

Under ``maxmemory`` with an ``allkeys-*`` policy Redis may evict the marker itself (the start
warns that it may evict held followers and buffers too). The CRITICAL line then said the Redis
was restarted, flushed or failed over, none of which happened: the operator looked for a restart.
Now a loss found on a Redis that has evicted keys says so, with the count of keys evicted.
"""

from __future__ import annotations

import logging

import pytest
from runtime.helpers import idle_lane
from runtime.private_redis import bare_client

from pipeline.runtime.state_loss import StateWatch, marker_key

LOGGER = "pipeline.runtime.state_loss"


async def test_an_evicted_marker_names_the_eviction(
    unique: str, caplog: pytest.LogCaptureFixture
) -> None:
    """allkeys-random under 2 MB: keys written until the marker goes; the line names eviction."""
    name, prefix = f"ev_{unique}", f"t{unique}"
    lane = idle_lane(name, retry={"tiers": ["1s"]})
    async with bare_client() as (server, client):
        await client.config_set("maxmemory", "2mb")
        await client.config_set("maxmemory-policy", "allkeys-random")
        watch = StateWatch(client, server.url, prefix, "g-ev", [lane])
        await watch.start()
        filler = b"x" * 1000
        for batch in range(2000):  # about 2,000 keys fill it; the marker goes at random
            async with client.pipeline(transaction=False) as pipe:
                for n in range(100):
                    pipe.set(f"fill:{batch}:{n}", filler)
                await pipe.execute()
            if not await client.exists(marker_key(prefix)):
                break
        assert not await client.exists(marker_key(prefix)), "the marker was never evicted"
        with caplog.at_level(logging.CRITICAL, logger=LOGGER):
            assert await watch.check() is True
    (record,) = caplog.records
    line = record.getMessage()
    assert "evicted" in line
    assert "maxmemory-policy allkeys-random" in line
