"""The debouncer on a Redis Cluster while a slot migrates (on a cluster of its own)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from admission.slot_migration import migrating, private_cluster
from redis.asyncio.cluster import RedisCluster

from pipeline.admission.debounce import Debouncer
from pipeline.admission.debounce import keys as dk
from pipeline.envelope import Message
from pipeline.errors import DebounceUnavailable
from pipeline.topics.spec import DebouncePolicy

pytestmark = pytest.mark.redis
PREFIX = "pltest"


@pytest.fixture(scope="module")
def private_url() -> Iterator[str]:
    """A Redis Cluster of this module's own, for the test that migrates a slot.

    A slot migrating on the shared cluster redirected a concurrent test's new key in that slot
    to the importing node, where it stayed once the slot was stable again (``slot_migration``).
    """
    with private_cluster() as url:
        yield url


async def test_a_claim_during_a_slot_migration_leases_nothing(private_url, unique):
    """A claim or step refused while its lane's slot migrates leases no turn to nobody.

    ``db_claim`` and ``db_step`` declared only the lane's keys, so Redis ran them on the migrating
    node and stopped them at the first conversation already moved, after leasing the turns before
    it: those turns were returned to no runner, waited out their lease and came back with their
    attempt raised, as if they had run and never finished.
    """
    client = RedisCluster.from_url(private_url)
    lane = f"mig{unique}"
    policy = DebouncePolicy(key="conversation_id", quiet_s=60, max_batch=1)  # due at once
    debouncer = Debouncer(client, PREFIX, lane, policy)
    state = dk.state_key(PREFIX, lane, "a")
    try:
        await debouncer.record("a", Message("chat", 0, 1, b"a", b"x", {}, 1_000))
        await debouncer.record("b", Message("chat", 0, 2, b"b", b"y", {}, 1_001))
        slot = await client.cluster_keyslot(dk.due_key(PREFIX, lane))
        moved = [dk.buffer_key(PREFIX, lane, "b"), dk.state_key(PREFIX, lane, "b")]
        async with migrating(client, slot, moved) as (source, _):
            with pytest.raises(DebounceUnavailable):
                await debouncer.claim(10)
            assert await source.hget(state, "tok") is None  # "a" was not leased
            with pytest.raises(DebounceUnavailable):
                await debouncer.step(10)
            assert await source.hget(state, "tok") is None
        await client.delete(*moved)  # "b" went with its keys (moved back to the owner after)
        turns = (await debouncer.claim(10)).turns
        assert [(turn.key, turn.attempt) for turn in turns] == [("a", 1)]
    finally:
        async for key in client.scan_iter(match=f"{dk.lane_tag(PREFIX, lane)}*"):
            await client.delete(key)
        await client.aclose()


async def test_a_record_on_an_unreachable_cluster_is_unavailable(unique):
    """With no cluster node reachable, a record raises DebounceUnavailable (handled alone)."""
    client = RedisCluster.from_url("redis://127.0.0.1:1")
    debouncer = Debouncer(client, PREFIX, f"down{unique}", DebouncePolicy(key="c", quiet_s=1))
    with pytest.raises(DebounceUnavailable):
        await debouncer.record("a", Message("chat", 0, 1, b"a", b"x", {}, 1_000))
    assert debouncer.stats.fail_open == 1
    await client.aclose()
