"""The ingress's fast path says why a produce failed, and its repeats stay backed off.

"produce failed; the sweeper will retry" alone left an operator guessing (a topic not applied?
a broker down? a message too large?). The line now carries the error's class and message; the
handlers' :class:`RepeatFilter` still takes failures alike but for their numbers as one line.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest
from logstore.helpers import FakeClock, new_row

from pipeline.config import Settings
from pipeline.envelope import Record
from pipeline.errors import DeliveryFailed
from pipeline.ingress.dispatch import REASON_CHARS, Dispatcher
from pipeline.log_repeats import RepeatFilter
from pipeline.logstore import NewRow
from pipeline.logstore.sqlite import SqliteLogStore
from pipeline.transport import create_transport
from pipeline.transport.protocol import Delivered, Producer

FAILURES = 20
LOGGER = "pipeline.ingress.dispatch"


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqliteLogStore]:
    """An open SQLite log store in the test's directory."""
    log = SqliteLogStore(tmp_path / "ingress.db")
    await log.open()
    yield log
    await log.close()


class Recorded:
    """The store, with an event set each time a produce failure is recorded."""

    def __init__(self, store: SqliteLogStore) -> None:
        """Record into ``store``."""
        self.store = store
        self.recorded = asyncio.Event()

    async def insert(self, row: NewRow) -> bool:
        """The store's insert."""
        return await self.store.insert(row)

    async def mark_produced(self, ids: Sequence[str]) -> None:
        """The store's own."""
        await self.store.mark_produced(ids)

    async def record_failure(self, ids: Sequence[str], error: str) -> None:
        """The store's own, then signal it."""
        await self.store.record_failure(ids, error)
        self.recorded.set()


async def _fail_one_at_a_time(
    producer: Producer, log: Recorded, rows: list[NewRow], caplog: pytest.LogCaptureFixture
) -> list[logging.LogRecord]:
    """Dispatch ``rows`` a produce at a time; the lines logged, as the handlers filter them."""
    dispatcher = Dispatcher(producer, log, linger_s=0, mark_interval_s=0)
    repeats = RepeatFilter(clock=lambda: 0.0)  # as configure_logging installs; no time passes
    caplog.handler.addFilter(repeats)
    try:
        with caplog.at_level(logging.WARNING, logger=LOGGER):
            for row in rows:
                log.recorded.clear()
                await log.insert(row)
                assert dispatcher.submit(row)
                await log.recorded.wait()
            await dispatcher.close()
    finally:
        caplog.handler.removeFilter(repeats)
    assert dispatcher.counters.failed == len(rows)
    return [r for r in caplog.records if r.name == LOGGER]


async def test_a_produce_to_a_missing_topic_says_why_once(
    store: SqliteLogStore,
    settings: Settings,
    redis_service: str,
    unique: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """20 rows to a topic never applied on a real Redis: one line naming the error and topic."""
    del redis_service  # started (or the test skipped) by its fixture
    clock = FakeClock()
    topic = f"absent-{unique}"
    rows = [new_row(n, clock, topic=topic) for n in range(FAILURES)]
    transport = create_transport(settings, "redis")
    producer = transport.producer()
    try:
        lines = await _fail_one_at_a_time(producer, Recorded(store), rows, caplog)
    finally:
        await producer.close()
        await transport.close()
    assert len(lines) == 1, [line.getMessage() for line in lines]
    message = lines[0].getMessage()
    assert message.startswith(f"produce of 1 rows to {topic} failed (UnknownTopic: "), message
    assert message.endswith("); the sweeper will retry")
    assert (lines[0].exc_info, lines[0].exc_text) == (None, None)


class Flaky:
    """A producer whose every batch fails with a reason whose figures change each time."""

    def __init__(self) -> None:
        """No batch yet."""
        self.batches = 0

    async def send_many(self, topic: str, records: Sequence[Record]) -> list[Delivered]:
        """Fail as a broker that timed out does, after a different number of milliseconds."""
        self.batches += 1
        raise DeliveryFailed(
            f"produce to {topic!r}: {len(records)} messages timed out after"
            f" {30_000 + self.batches} ms at 127.0.0.1:{9000 + self.batches}"
        )

    async def close(self) -> None:
        """Nothing to close."""


async def test_a_reason_whose_figures_vary_is_still_backed_off(
    store: SqliteLogStore, caplog: pytest.LogCaptureFixture
) -> None:
    """20 failures whose reasons differ only in numbers: one line, with the first reason."""
    clock = FakeClock()
    rows = [new_row(n, clock, topic="messages") for n in range(FAILURES)]
    lines = await _fail_one_at_a_time(Flaky(), Recorded(store), rows, caplog)  # type: ignore[arg-type]
    first = (
        "produce of 1 rows to messages failed (DeliveryFailed: produce to 'messages': 1 messages"
        " timed out after 30001 ms at 127.0.0.1:9001); the sweeper will retry"
    )
    assert [line.getMessage() for line in lines] == [first]


async def test_a_long_reason_is_cut(
    store: SqliteLogStore, caplog: pytest.LogCaptureFixture
) -> None:
    """A broker's message of 10,000 characters on several lines: one line, its reason cut."""

    class Verbose(Flaky):
        async def send_many(self, topic: str, records: Sequence[Record]) -> list[Delivered]:
            del topic, records  # any batch
            raise DeliveryFailed("x\n" * 5_000)

    lines = await _fail_one_at_a_time(
        Verbose(),
        Recorded(store),
        [new_row(0, FakeClock())],
        caplog,  # type: ignore[arg-type]
    )
    (line,) = lines
    reason = line.getMessage().partition("(")[2].rpartition(")")[0]
    assert len(reason) == REASON_CHARS
    assert reason.startswith("DeliveryFailed: x x x")
    assert reason.endswith("...")
    assert "\n" not in line.getMessage()
