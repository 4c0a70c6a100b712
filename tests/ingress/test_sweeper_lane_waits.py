"""Both log stores claim a backed-up topic's rows only once overdue by the topic's own bound."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from logstore.helpers import FakeClock, new_row, real_log_store

from pipeline.config import Settings
from pipeline.logstore import LogStore


@pytest.fixture(params=["sqlite", "postgres"])
async def store(
    request: pytest.FixtureRequest, tmp_path: Path, settings: Settings
) -> AsyncIterator[tuple[LogStore, FakeClock]]:
    """A real, empty log store of each kind on a clock the test moves."""
    if request.param == "postgres":
        request.getfixturevalue("postgres_service")
    clock = FakeClock()
    async with real_log_store(request.param, tmp_path, settings.postgres.url, clock) as log:
        yield log, clock


async def test_a_topic_with_its_own_overdue_bound_waits_for_it(
    store: tuple[LogStore, FakeClock],
) -> None:
    """A patient topic given its own overdue time is claimed past it, not past the common one."""
    log, clock = store
    plain = new_row(1, clock, topic="messages")
    slow = new_row(2, clock, topic="reports")
    for row in (plain, slow):
        await log.insert(row)
    await log.mark_produced([plain.id, slow.id])
    produced_ms = clock.now_ms
    clock.advance(60)

    async def claim(slow_overdue_ms: int) -> list[str]:
        rows = await log.claim_unprocessed(
            clock.now_ms,
            limit=10,
            lease_ms=1,
            patient_topics={"messages", "reports"},
            overdue_before_ms=produced_ms + 1,
            overdue_by_topic_ms={"reports": slow_overdue_ms},
        )
        return sorted(row.id for row in rows)

    assert await claim(produced_ms) == [plain.id]
    clock.advance(1)  # the leases lapse
    assert await claim(produced_ms + 1) == [plain.id, slow.id]
