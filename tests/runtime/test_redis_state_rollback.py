"""A Redis that comes back with part of its data (an older snapshot) is reported too.

The marker was written once, at the member's start, and only its presence and value were read
after: a Redis restarted from a snapshot taken after that start (``save`` points, the default;
or a replica that lagged, promoted) still had it, so the held followers written since the
snapshot were lost without a word, though the module, the metric and the alert name that very
case. The marker now counts each look (``HINCRBY``): a count that went back is a loss.

And the CRITICAL line sent operators to ``pipeline replay`` even when the member marks its log
rows processed, where the sweeper replays the webhooks among the lost messages on its own.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from runtime.helpers import idle_lane
from runtime.private_redis import bare_client

from pipeline.observability.metrics import Metrics
from pipeline.runtime.state_loss import StateLostCounter, StateWatch, marker_key

LOGGER = "pipeline.runtime.state_loss"


async def test_a_redis_back_on_an_older_snapshot_is_a_loss(
    tmp_path: Path, unique: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Snapshot, a held follower written, SIGKILL, restart: one CRITICAL line and one count."""
    name, prefix, group = f"rb_{unique}", f"t{unique}", f"g-{unique}"
    held = f"{{{prefix}:guard:{name}}}:held"
    metrics = Metrics()
    lanes = [idle_lane(name, retry={"tiers": ["1s"]})]
    async with bare_client(tmp_path) as (server, client):
        counter = StateLostCounter(metrics, group)
        watch = StateWatch(client, server.url, prefix, group, lanes, counter)
        await watch.start()
        assert await watch.check() is False
        assert await client.save()  # the marker is in the snapshot
        assert await watch.check() is False  # the member keeps looking
        await client.set(held, b"a follower held behind its parked key")
        server.crash()
        server.start()
        await client.connection_pool.disconnect()  # its sockets went with the old process
        assert await client.exists(held) == 0  # the follower is lost
        assert await client.exists(marker_key(prefix)) == 1  # the marker is not
        with caplog.at_level(logging.CRITICAL, logger=LOGGER):
            assert await watch.check() is True
            assert await watch.check() is False
    assert [r.levelno for r in caplog.records] == [logging.CRITICAL], caplog.text
    line = caplog.records[0].getMessage()
    assert f"marker {marker_key(prefix)}'s count went back" in line
    assert f"held followers of parked keys (lanes {name})" in line
    count = metrics.registry.get_sample_value("pipeline_redis_state_lost_total", {"group": group})
    assert count == 1.0


@pytest.mark.parametrize("marks_processed", [True, False])
async def test_the_line_says_who_replays_the_webhooks(
    unique: str, caplog: pytest.LogCaptureFixture, *, marks_processed: bool
) -> None:
    """Rows marked processed: the sweeper replays the lost webhooks; else ``pipeline replay``."""
    name, prefix = f"rp_{unique}", f"t{unique}"
    lanes = [idle_lane(name, retry={"tiers": ["1s"]})]
    async with bare_client() as (server, client):
        watch = StateWatch(
            client, server.url, prefix, f"g-{unique}", lanes, marks_processed=marks_processed
        )
        await watch.start()
        await client.flushall()
        with caplog.at_level(logging.CRITICAL, logger=LOGGER):
            assert await watch.check() is True
    (record,) = caplog.records
    line = record.getMessage()
    assert "\n" not in line
    assert f"marker {marker_key(prefix)} gone" in line
    if marks_processed:
        assert "the ingress's sweeper replays those that came through it" in line
        assert "pipeline replay" not in line
    else:
        assert "pipeline replay" in line
        assert "PIPELINE_RUNTIME__MARK_PROCESSED=true" in line
