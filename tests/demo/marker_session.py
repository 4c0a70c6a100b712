"""A pytest session of its own, run by ``test_demo_state_markers_kept.py`` (never collected).

One test writes the state marker of another prefix, as a ``make demo`` member does while a
test run goes on; another test's prefix (``t<unique>``) gets its marker written after the test
ended (as by a member's last look), which only the session's end can delete.
``MARKER_SESSION_FOREIGN`` names the other prefix, ``MARKER_SESSION_UNIQUES`` the file the
session writes its tests' unique values to.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from redis.asyncio import Redis
from support import test_settings

from pipeline.runtime.state_loss import look, marker_key


async def _write_marker(prefix: str, group: str) -> None:
    """One look at ``prefix``'s marker by a member of ``group``: it is written if missing."""
    client = Redis.from_url(test_settings().redis.url)
    try:
        await look(client, marker_key(prefix), group)
    finally:
        await client.aclose()


@pytest.fixture(scope="session")
def late_markers() -> Iterator[list[str]]:
    """Prefixes whose markers are written once every test has ended."""
    prefixes: list[str] = []
    yield prefixes
    for prefix in prefixes:
        asyncio.run(_write_marker(prefix, "g-late"))


def test_a_member_of_another_prefix_writes_its_marker() -> None:
    """The other prefix's marker appears during the session, as a running demo's does."""
    asyncio.run(_write_marker(os.environ["MARKER_SESSION_FOREIGN"], "demo-messages"))


def test_a_tests_prefix_gets_its_marker_after_the_test(
    unique: str, late_markers: list[str]
) -> None:
    """``t<unique>``'s marker is written after this test's keys were deleted."""
    late_markers.append(f"t{unique}")
    Path(os.environ["MARKER_SESSION_UNIQUES"]).write_text(unique, encoding="utf-8")
