"""What a member logs at INFO: the start line, progress lines, and a warning per dead letter."""

from __future__ import annotations

import asyncio
import logging

import pytest
from pydantic import BaseModel, ValidationError

from pipeline.envelope import TopicPartition
from pipeline.observability.facades import RuntimeMetrics
from pipeline.observability.metrics import Metrics
from pipeline.runtime.progress import DeadLetterWarnings, Progress, partitions_text
from pipeline.runtime.stats import Stats
from pipeline.transport.protocol import PartitionLag


class LagOf:
    """An admin fake for the one call progress makes: a fixed lag per topic."""

    def __init__(self, lag: dict[str, int]) -> None:
        """Report ``lag`` messages behind on each topic (one partition each)."""
        self.lag = lag

    async def group_lag(self, group: str, topic: str) -> list[PartitionLag]:  # noqa: ARG002
        """One partition, ``lag`` behind."""
        return [PartitionLag(TopicPartition(topic, 0), 0, self.lag.get(topic, 0), None)]


def progress(stats: Stats, admin: LagOf, assignment: list[TopicPartition]) -> Progress:
    """A reporter on the lane ``messages`` of group ``replies``."""
    return Progress(
        group="replies",
        lanes=["messages"],
        topics=["messages"],
        transport="redis",
        address="redis://127.0.0.1:6379/0",
        admin=admin,  # type: ignore[arg-type]  # only group_lag is called
        stats=stats,
        assignment=lambda: assignment,
        interval_s=0.01,
    )


def test_partitions_fold_into_ranges() -> None:
    """Consecutive partitions of a topic print as a range, gaps as separate runs."""
    tps = [TopicPartition("m", p) for p in (0, 1, 2, 5, 7, 8)] + [TopicPartition("m.dlq", 3)]
    assert partitions_text(tps) == "m[0-2,5,7-8], m.dlq[3]"
    assert partitions_text([]) == "none yet"


async def test_start_line_then_progress_only_when_something_moves(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The start line names group, lanes, transport and partitions; idle repeats stay silent."""
    caplog.set_level(logging.INFO, logger="pipeline.runtime.progress")
    stats, admin = Stats(), LagOf({})
    reporter = progress(stats, admin, [TopicPartition("messages", p) for p in range(3)])
    reporter.started()
    await reporter.report()  # nothing handled, nothing waiting: no line
    stats.handled, stats.dead_lettered, admin.lag["messages"] = 5, 1, 2
    await reporter.report()
    await reporter.report()  # unchanged: no second line
    lines = [r.getMessage() for r in caplog.records]
    start = (
        "consuming as group replies: lanes messages on redis (redis://127.0.0.1:6379/0); "
        "3 partition(s): messages[0-2]"
    )
    assert lines == [start, "group replies: handled 5, retried 0, dead-lettered 1; lag 2"]


class Lines(logging.Handler):
    """Collects messages and sets ``enough`` once ``wanted`` of them arrived."""

    def __init__(self, wanted: int) -> None:
        """Wait for ``wanted`` records."""
        super().__init__()
        self.messages: list[str] = []
        self.wanted = wanted
        self.enough = asyncio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        """Keep the message; signal when there are enough."""
        self.messages.append(record.getMessage())
        if len(self.messages) >= self.wanted:
            self.enough.set()


async def test_run_starts_once_polling_and_ends_with_stop() -> None:
    """run() logs the start line after the member polls, then progress, and returns on stop."""
    lines = Lines(wanted=2)
    logger = logging.getLogger("pipeline.runtime.progress")
    logger.addHandler(lines)
    level = logger.level
    logger.setLevel(logging.INFO)
    try:
        polling, stop = asyncio.Event(), asyncio.Event()
        reporter = progress(Stats(handled=1), LagOf({}), [TopicPartition("messages", 0)])
        task = asyncio.create_task(reporter.run(polling, stop))
        polling.set()
        await asyncio.wait_for(lines.enough.wait(), 10)
        stop.set()
        await task
    finally:
        logger.removeHandler(lines)
        logger.setLevel(level)
    assert lines.messages[0].startswith("consuming as group replies")
    assert "handled 1" in lines.messages[1]


def test_dead_letter_warns_and_still_counts(caplog: pytest.LogCaptureFixture) -> None:
    """Each dead letter is one WARNING with lane, reason and DLQ, and the metric still counts."""
    metrics = Metrics()
    RuntimeMetrics(metrics).retried("messages", "5s")  # the member's other facade, same registry
    facade = DeadLetterWarnings(metrics, {"messages": "messages.dlq"})
    facade.retried("messages", "5s")
    with caplog.at_level(logging.WARNING, logger="pipeline.runtime.progress"):
        facade.dead_lettered("messages", "fatal")
    (record,) = caplog.records
    assert record.levelno == logging.WARNING
    assert record.getMessage() == (
        "dead letter on lane messages: fatal (inspect: pipeline redrive messages.dlq --dry-run)"
    )
    sample = metrics.registry.get_sample_value(
        "pipeline_dead_letters_total", {"lane": "messages", "reason": "fatal"}
    )
    assert sample == 1.0
    retries = metrics.registry.get_sample_value(
        "pipeline_retries_total", {"lane": "messages", "tier": "5s"}
    )
    assert retries == 2.0  # one set of instruments for both


def test_a_dead_letters_line_says_the_error_that_ended_it(caplog: pytest.LogCaptureFixture) -> None:
    """The error's class and its message on one line, cut short; all of it is in the DLQ."""

    class Said(BaseModel):
        text: str

    with pytest.raises(ValidationError) as invalid:
        Said.model_validate_json(b"not json")
    facade = DeadLetterWarnings(Metrics(), {"messages": "messages.dlq"})
    long = "x" * 1000
    with caplog.at_level(logging.WARNING, logger="pipeline.runtime.progress"):
        facade.dead_lettered("messages", "exhausted", ConnectionError("refused\n  at the bank"))
        facade.dead_lettered("messages", "fatal", ValueError(long))
        facade.dead_lettered("messages", "fatal", TimeoutError())  # a ValueError would be alike
        facade.dead_lettered("messages", "fatal", invalid.value)
    said = [r.getMessage() for r in caplog.records]
    assert said[0] == (
        "dead letter on lane messages: exhausted: ConnectionError: refused; at the bank "
        "(inspect: pipeline redrive messages.dlq --dry-run)"
    )
    assert f": ValueError: {'x' * 297}... (inspect" in said[1]
    assert said[2].startswith("dead letter on lane messages: fatal: TimeoutError (inspect")
    # pydantic's first line only counts the errors: what is wrong comes after it.
    assert said[3].startswith(
        "dead letter on lane messages: fatal: ValidationError: 1 validation error for Said;"
        " Invalid JSON: expected ident at line 1 column 2"
    ), said[3]
    assert "errors.pydantic.dev" not in said[3]
