"""What a running member says at the default log level: a start line, progress, dead letters.

``pipeline consume`` logs, at INFO (the level ``PIPELINE_LOG_LEVEL`` defaults to for it):

- one start line once the member joined its group: group, lanes, partitions, transport;
- a progress line every :data:`PROGRESS_INTERVAL_S` while anything moves: handled, retried and
  dead-lettered since start, and the group's lag on the member's lanes;
- one WARNING per dead letter with its lane, reason and error (:class:`DeadLetterWarnings`, a
  :class:`~pipeline.observability.facades.RuntimeMetrics` that also logs); alike ones (lane,
  reason, exception type, whatever its text) are backed off like any repeated warning, the
  next line shown counting those held back. A dead letter of a handler's or turn's failure is
  told by the failure log's line instead (:mod:`~pipeline.runtime.failure_log`: the failure,
  its traceback, ``next: dead letter (<reason>)`` and the same redrive hint), or held back
  behind an alike dead letter's line of it; those of no failure line (poison, sequenced,
  expired, shed, a run whose heartbeat stopped, a ``DeadLetter`` the handler raised on
  purpose: an INFO line there) keep theirs, and so do those produced before a cancelled
  routing (a turn's, at shutdown or revocation), whose failure line never comes.

:func:`pipeline.runtime.run.serve` wires all three; nothing here changes what the member does.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from typing import Protocol

from pipeline.envelope import TopicPartition
from pipeline.errors import PipelineError
from pipeline.log_repeats import JUDGED, RepeatFilter, error_text, shown_now
from pipeline.observability.facades import RuntimeMetrics
from pipeline.observability.metrics import Metrics
from pipeline.runtime.failure_log import told
from pipeline.runtime.stats import Stats
from pipeline.transport.protocol import Admin

__all__ = ["PROGRESS_INTERVAL_S", "DeadLetterWarnings", "Progress", "partitions_text"]

log = logging.getLogger(__name__)

PROGRESS_INTERVAL_S = 30.0
"""Seconds between progress lines (none while nothing was handled and nothing waits)."""


class DeadLetterWarnings(RuntimeMetrics):
    """The member's metrics facade, plus a WARNING per dead letter (alike ones backed off)."""

    def __init__(
        self,
        metrics: Metrics,
        dead_letter_topics: dict[str, str],
        repeats: RepeatFilter | None = None,
    ) -> None:
        """Write into ``metrics``; ``dead_letter_topics`` maps lane to DLQ.

        The instruments are the registry's own, looked up: no second set beside another facade.
        ``repeats`` backs off alike dead letters' lines (a filter of its own by default).
        """
        super().__init__(metrics)
        self._dlq = dead_letter_topics
        self._repeats = repeats or RepeatFilter()

    def dead_lettered(self, lane: str, reason: str, error: BaseException | None = None) -> None:
        """Count the dead letter and say where it went, what ended it and how to look at it.

        Alike ones (lane, reason, the error's type) are held back by the repeat filter before
        anything is formatted: the error's text (a key, an id) is not what makes them alike.
        One the failure log tells (a handler's or turn's failure) is only counted, unless its
        routing ends without a line saying dead letter (cancelled halfway through a turn's dead
        letters, or a turn's later dead letter not produced).
        """
        super().dead_lettered(lane, reason, error)
        if not log.isEnabledFor(logging.WARNING):
            return
        if not told(error, lambda: self._warn(lane, reason, error)):
            self._warn(lane, reason, error)

    def _warn(self, lane: str, reason: str, error: BaseException | None) -> None:
        """The dead letter's WARNING, unless alike ones hold it back."""
        kind = "" if error is None else f": {type(error).__module__}.{type(error).__qualname__}"
        held = shown_now(self._repeats, log, f"dead letter on lane {lane}: {reason}{kind}")
        if held is None:
            return
        dlq = self._dlq.get(lane, f"{lane}.dlq")
        log.warning(
            "dead letter on lane %s: %s%s (inspect: pipeline redrive %s --dry-run)%s",
            lane,
            reason,
            _said(error),
            dlq,
            held,
            extra={JUDGED: True},  # backed off here: the root handler's filter lets it be
        )


_SAID_CHARS = 300
"""The longest error text a dead letter's line repeats (the dead letter's headers hold it all)."""


def _said(error: BaseException | None) -> str:
    """``": Class: its message"`` for the dead letter's line, on one line; empty without one.

    A message of several lines (pydantic's: a count, then each problem indented) is joined with
    ``; ``, leaving out pydantic's "For further information" links, and cut at
    :data:`_SAID_CHARS`.
    """
    if error is None:
        return ""
    lines = [line.strip() for line in error_text(error).splitlines()]
    said = "; ".join(
        line for line in lines if line and not line.startswith("For further information visit")
    )
    if len(said) > _SAID_CHARS:
        said = said[: _SAID_CHARS - 3] + "..."
    return f": {type(error).__name__}: {said}" if said else f": {type(error).__name__}"


class ParkingView(Protocol):
    """What :class:`ParkedKeysSource` reads (a :class:`~pipeline.runtime.member.Member`)."""

    async def parked_keys(self) -> dict[str, int]:
        """Keys parked now per ordered lane with retry tiers."""
        ...


class ParkedKeysSource:
    """A ``/metrics`` source: the keys parked per ordered lane, read from Redis each refresh.

    Parking is decided in Redis, by any member of the group, so the gauge is read there rather
    than counted by this member.
    """

    name = "parked_keys"

    def __init__(self, member: ParkingView, metrics: RuntimeMetrics) -> None:
        """Read ``member``'s lanes' parked keys into ``metrics``."""
        self._member = member
        self._metrics = metrics

    async def refresh(self) -> None:
        """Set ``pipeline_parked_keys`` for every ordered lane with retry tiers."""
        for lane, count in (await self._member.parked_keys()).items():
            self._metrics.parked_keys(lane, count)


def partitions_text(assignment: Sequence[TopicPartition]) -> str:
    """``messages[0-11], messages.retry.5s[0-11]``: each topic's partitions, ranges folded."""
    by_topic: dict[str, list[int]] = {}
    for tp in assignment:
        by_topic.setdefault(tp.topic, []).append(tp.partition)
    parts = []
    for topic, numbers in sorted(by_topic.items()):
        numbers.sort()
        runs: list[str] = []
        start = prev = numbers[0]
        for n in [*numbers[1:], None]:
            if n is not None and n == prev + 1:
                prev = n
                continue
            runs.append(str(start) if start == prev else f"{start}-{prev}")
            if n is not None:
                start = prev = n
        parts.append(f"{topic}[{','.join(runs)}]")
    return ", ".join(parts) or "none yet"


class Progress:
    """Logs the start line once the member polls, then a progress line while work moves."""

    def __init__(
        self,
        *,
        group: str,
        lanes: Sequence[str],
        topics: Sequence[str],
        transport: str,
        address: str,
        admin: Admin,
        stats: Stats,
        assignment: Callable[[], Sequence[TopicPartition]],
        interval_s: float = PROGRESS_INTERVAL_S,
    ) -> None:
        """Report on the member of ``group`` whose ``stats`` and ``assignment`` are given.

        ``topics`` are the lanes' main topics, whose lag the progress line sums.
        """
        self._group = group
        self._lanes = list(lanes)
        self._topics = list(topics)
        self._transport = transport
        self._address = address
        self._admin = admin
        self._stats = stats
        self._assignment = assignment
        self._interval_s = interval_s
        self._last: tuple[int, int, int, int] | None = None

    def started(self) -> None:
        """The start line: group, lanes, partitions and transport."""
        assignment = self._assignment()
        log.info(
            "consuming as group %s: lanes %s on %s (%s); %d partition(s): %s",
            self._group,
            ", ".join(self._lanes),
            self._transport,
            self._address,
            len(assignment),
            partitions_text(assignment),
        )

    async def lag(self) -> int | None:
        """The group's lag summed over the lanes' main topics (None when it cannot be read)."""
        try:
            lags = await asyncio.gather(
                *(self._admin.group_lag(self._group, topic) for topic in self._topics)
            )
        except PipelineError:
            return None
        return sum(p.lag for per_topic in lags for p in per_topic)

    async def report(self) -> None:
        """One progress line, unless nothing changed and nothing waits since the last one."""
        s = self._stats
        lag = await self.lag()
        now = (s.handled, s.retried, s.dead_lettered, lag or 0)
        if now == self._last or (self._last is None and not any(now)):
            return
        self._last = now
        log.info(
            "group %s: handled %d, retried %d, dead-lettered %d; lag %s",
            self._group,
            s.handled,
            s.retried,
            s.dead_lettered,
            "unknown" if lag is None else lag,
        )

    async def run(self, polling: asyncio.Event, stop: asyncio.Event) -> None:
        """Log the start line once ``polling`` is set, then report every interval until ``stop``."""
        waiter = asyncio.create_task(polling.wait())
        stopper = asyncio.create_task(stop.wait())
        await asyncio.wait({waiter, stopper}, return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()
        stopper.cancel()
        if stop.is_set():
            return
        self.started()
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self._interval_s)
            await self.report()
