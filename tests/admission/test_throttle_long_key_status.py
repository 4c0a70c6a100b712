"""A throttle key longer than the key-name bound is still found by what reads keys back.

A key over :data:`~pipeline.redis_keys.NAME_PART_MAX_BYTES` bytes is stored by its digest. When
the whole key became ``#sha256:<hex>``, its template's fixed text went with it: ``pipeline
status``, which finds a lane's tenants among the active keys by that text (``org:``), never
listed a tenant of 2 KiB however many of its messages waited, and ``pipeline throttle status``
showed a bare digest with nothing to say what kind of key it was. The digested form now keeps
the key's head, so ``org:`` and the first characters of the tenant stay readable.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis
from runtime.helpers import lane_spec

from pipeline.admission import keys as k
from pipeline.admission.keys import key_text
from pipeline.admission.throttle import Throttle
from pipeline.admission.view import ThrottledTenants
from pipeline.redis_keys import NAME_PART_MAX_BYTES

pytestmark = pytest.mark.redis

TENANT = "t" * 2047 + "a"
"""A 2 KiB tenant (``pl-tenant``), over the bound."""


@pytest.fixture
async def throttle(redis_service: str, unique: str) -> AsyncIterator[Throttle]:
    """A started throttle on a namespace of its own; its keys are deleted after the test."""
    t = Throttle(Redis.from_url(redis_service), namespace=f"long{unique}", default_limit=1)
    await t.start()
    yield t
    await t.close()
    pattern = k.tag(t.prefix, t.namespace).replace("{", "\\{").replace("}", "\\}") + ":*"
    left = [key async for key in t.client.scan_iter(match=pattern, count=1000)]
    if left:
        await t.client.delete(*left)
    await t.client.aclose()


def test_a_long_key_keeps_its_head_and_stays_bounded_and_distinct() -> None:
    """Over the bound: its head, then the digest of the whole key; the form is its own form."""
    stored = key_text(f"org:{TENANT}")
    assert stored.startswith("org:ttt")
    assert "#sha256:" in stored
    assert len(stored.encode()) <= NAME_PART_MAX_BYTES
    assert key_text(stored) == stored
    assert key_text(f"org:{TENANT[:-1]}b") != stored
    at_bound = "org:" + "t" * (NAME_PART_MAX_BYTES - 4)
    assert key_text(at_bound) == at_bound


async def test_pipeline_status_lists_a_waiting_tenant_of_2_kib(throttle: Throttle) -> None:
    """Two jobs of one 2 KiB tenant on a limit of 1: the view lists the tenant, one waiting."""
    t = throttle
    spec = lane_spec("long_tenants", 1, throttle={"keys": ["org:{tenant}"]})
    key = f"org:{TENANT}"
    held = await t.acquire([key])
    second = asyncio.create_task(t.acquire([key]))
    try:
        async with asyncio.timeout(30):  # the second job waits once its first call returned
            while not (await t.status(key)).waiters:  # each try is a round trip to Redis
                pass
        view = ThrottledTenants(
            t.client, [spec], prefix=t.prefix, namespace=t.namespace, default_limit=1
        )
        listed = await view.throttled_tenants("long_tenants", 10)
        assert len(listed) == 1, listed
        tenant, count = listed[0]
        assert count == 1
        assert tenant.startswith("ttt")
        assert (await t.status(key)).key == key_text(key)
    finally:
        await t.release(held)
        await t.release(await second)
