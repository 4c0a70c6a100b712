"""The ingress reports work that waits in the members' Redis, should every member die."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from ingress.helpers import started_and_stopped

pytestmark = pytest.mark.usefixtures("redis_service")


async def _sources_of(tmp_path: Path, spec: dict[str, Any]) -> set[str]:
    """The names of the metric sources an ingress over the one lane ``spec`` refreshes."""
    sources = {"plain": {"scheme": "none", "topic": spec["name"]}}
    return await started_and_stopped(tmp_path, spec, sources)


async def test_an_ordered_lane_with_tiers_gets_its_held_releases_reported(
    tmp_path: Path,
) -> None:
    """Held followers wait in Redis only: the ingress reads their releases without a debouncer."""
    spec = {"name": "t", "partitions": 1, "retry": {"tiers": ["1s"], "max_attempts": 2}}
    assert "held_release_overdue" in await _sources_of(tmp_path, spec)


async def test_a_lane_that_holds_nothing_opens_no_redis_for_it(tmp_path: Path) -> None:
    """An unordered lane parks nothing: no source, no client."""
    spec = {"name": "t", "partitions": 1, "ordered": False, "retry": {"tiers": ["1s"]}}
    assert "held_release_overdue" not in await _sources_of(tmp_path, spec)
