"""The state watch lets its broker client go at the start, whether it asked the broker or not.

``pipeline consume`` hands the watch an admin client (on Kafka, a librdkafka client with its own
threads) to ask, when the marker is missing at start, whether the group consumed before. A
marker found in place (every restart but the first) left that client held by the watch for the
member's life, never asked anything; now every start lets it go.
"""

from __future__ import annotations

import gc
import weakref

from runtime.helpers import idle_lane
from runtime.private_redis import bare_client

from pipeline.runtime.state_loss import StateWatch
from pipeline.transport.protocol import PartitionLag


class _NeverCommitted:
    """A broker where the group has committed nothing: a first start."""

    def __init__(self) -> None:
        self.calls = 0

    async def group_lag(self, group: str, topic: str) -> list[PartitionLag]:
        del group, topic
        self.calls += 1
        return []


async def test_a_start_with_the_marker_in_place_lets_the_admin_client_go(unique: str) -> None:
    """Marker written by a first member; a second one's start asks nothing and keeps nothing."""
    lane = idle_lane(f"ag_{unique}", retry={"tiers": ["5s"]})
    group, prefix = f"g-{unique}", f"t{unique}"
    async with bare_client() as (server, client):
        first_admin = _NeverCommitted()
        first = StateWatch(client, server.url, prefix, group, [lane], admin=first_admin)
        assert await first.start() is False  # the marker was missing: the broker was asked
        assert first_admin.calls == 1

        admin = _NeverCommitted()
        held = weakref.ref(admin)
        second = StateWatch(client, server.url, prefix, group, [lane], admin=admin)
        del admin
        assert await second.start() is False
        gc.collect()
        assert held() is None, "the watch still holds the admin client it never asked"
        assert await second.check() is False  # the watch itself runs on
