"""Repeated warnings with backoff: the first is logged, its repeats ever more rarely, counted.

While a service is down the same warning comes from a retry loop several times a second
(``poll failed, retrying: ...``, librdkafka's ``Connect to ... failed``). :class:`RepeatFilter`
lets the first through, then one after 1 s, 2 s, 4 s ... up to :data:`MAX_GAP_S`, each saying
how many like it were held back; a message quiet for :data:`MAX_GAP_S` starts over. Records are
alike when they share logger, level and text with every number blanked out (``after 0ms`` and
``after 1ms`` are alike; ``lane messages`` and ``lane engagement`` are not), or, for a record
carrying an exact repeat key (:data:`REPEAT_KEY`), logger, level and that key, nothing blanked
(lanes ``orders1`` and ``orders2`` are not alike). Only WARNING and above are touched, and a
record marked :data:`JUDGED` (its caller backed it off already, with a filter of its own) passes
untouched and unstored.

A line that is not a warning (the ingress's INFO refusals), or whose own text differs each time
(a failure's key and exception text), is judged by what it is about instead: :func:`shown_now`
asks a filter whether a line of a given repeat key is shown now, and with what count appended;
the runtime's failure lines and the ingress's refusal lines share it.
"""

from __future__ import annotations

import heapq
import logging
import os
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from pipeline.errors import ConfigError

__all__ = [
    "FIRST_GAP_S",
    "JUDGED",
    "MAX_GAP_S",
    "REPEAT_KEY",
    "RepeatFilter",
    "configure_logging",
    "error_text",
    "logging_from_environment",
    "shown_now",
]

_NUMBER = re.compile(r"\d+")

FIRST_GAP_S = 1.0
"""Seconds after a warning before the first of its repeats is logged."""
MAX_GAP_S = 60.0
"""The longest gap between two logged repeats of one warning."""
MAX_KEPT = 4096
"""Warnings remembered at most: a text with parts other than numbers that differ each time
(a producer's bytes, a key) must not grow the table for the process's life. Past it, those
quiet for :data:`MAX_GAP_S` (which would start over anyway) are forgotten, then the least
recently seen, a quarter of the table at least each time."""
JUDGED = "repeat_judged"
"""A record attribute (``extra={JUDGED: True}``): its caller already backed it off, so a
:class:`RepeatFilter` lets it through without storing it. A failure line, traceback included,
would otherwise be kept as its own key (up to ~16 kB each), and could be held back by the root
filter after its caller chose to show it, its ``[N more ...]`` count lost."""
REPEAT_KEY = "repeat_key"
"""A record attribute (``extra={REPEAT_KEY: "..."}``): what makes it alike to others, exactly,
numbers not blanked (lane ``orders1`` is not ``orders2``)."""


@dataclass
class _Seen:
    next_at_s: float
    gap_s: float
    held: int = 0
    last_s: float = 0.0


class RepeatFilter(logging.Filter):
    """A handler filter that logs repeats of a warning with exponential backoff."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        """Measure gaps with ``clock`` (seconds)."""
        super().__init__()
        self._clock = clock
        self._seen: dict[tuple[str, int, bool, str], _Seen] = {}
        # A handler runs its filters before it takes its own lock, and warnings come from more
        # than one thread (librdkafka's from the threads polling its clients).
        self._lock = threading.Lock()

    @property
    def kept(self) -> int:
        """How many kinds of warning are remembered now (at most :data:`MAX_KEPT`)."""
        with self._lock:
            return len(self._seen)

    def filter(self, record: logging.LogRecord) -> bool:
        """True to log ``record`` (with a held-back count appended), False to hold it back."""
        if record.levelno < logging.WARNING or getattr(record, JUDGED, False) is True:
            return True
        exact = getattr(record, REPEAT_KEY, None)
        if isinstance(exact, str):
            key = (record.name, record.levelno, True, exact)
        else:
            key = (record.name, record.levelno, False, _NUMBER.sub("#", record.getMessage()))
        with self._lock:
            return self._passes(record, key)

    def _passes(self, record: logging.LogRecord, key: tuple[str, int, bool, str]) -> bool:
        """:meth:`filter` for a warning alike to those of ``key``, under the lock."""
        now = self._clock()
        seen = self._seen.get(key)
        if seen is None or now - seen.last_s >= MAX_GAP_S:
            if seen is None and len(self._seen) >= MAX_KEPT:
                self._forget(now)
            self._seen[key] = _Seen(now + FIRST_GAP_S, FIRST_GAP_S, last_s=now)
            return True
        seen.last_s = now
        if now < seen.next_at_s:
            seen.held += 1
            return False
        if seen.held:
            record.msg = f"{record.msg} [{seen.held} more like this in the last {seen.gap_s:g}s]"
        seen.gap_s = min(seen.gap_s * 2, MAX_GAP_S)
        seen.next_at_s = now + seen.gap_s
        seen.held = 0
        return True

    def _forget(self, now: float) -> None:
        """Make room for a quarter of the table: the warnings quiet for :data:`MAX_GAP_S` first.

        All the quiet ones go; when they are fewer than a quarter, the least recently seen make
        up the rest, so the next :data:`MAX_KEPT` // 4 new warnings find room without another
        pass. A warning still repeating (seen lately) keeps its backoff.
        """
        quiet = [key for key, seen in self._seen.items() if now - seen.last_s >= MAX_GAP_S]
        for key in quiet:
            del self._seen[key]
        short = MAX_KEPT // 4 - len(quiet)
        if short > 0:
            oldest = heapq.nsmallest(short, self._seen.items(), key=lambda item: item[1].last_s)
            for key, _ in oldest:
                del self._seen[key]


def shown_now(repeats: RepeatFilter, logger: logging.Logger, alike: str) -> str | None:
    """Whether a line of ``logger`` alike to those named ``alike`` is shown now, by ``repeats``.

    None: it is held back. Otherwise what its line ends with: ``" [N more like this in the last
    Gs]"`` when some alike were held back, else nothing. It is judged as a warning whatever the
    line's own level (the filter passes anything below WARNING untouched), and only ``alike`` is
    judged, exactly (its numbers kept: lane ``orders1`` is not ``orders2``), so lines whose own
    text differs each time (a key, an error's text, a path) are backed off by what they are
    about, and nothing of one held back is formatted. ``alike`` should be one of a bounded set:
    each distinct one is remembered (up to :data:`MAX_KEPT`).
    """
    gate = logging.LogRecord(logger.name, logging.WARNING, __file__, 0, alike, None, None)
    setattr(gate, REPEAT_KEY, alike)
    if not repeats.filter(gate):
        return None
    return str(gate.msg)[len(alike) :]


def error_text(error: BaseException) -> str:
    """``str(error)`` for a log line or a header, or a placeholder when its ``__str__`` raises.

    An exception is the app's: its ``__str__`` may raise, and the line (or the retry copy)
    that names it must still be written, or the message it failed on is never routed.
    """
    try:
        return str(error)
    except Exception:  # a broken __str__ of the app's must not break the line or the routing
        return f"<{type(error).__name__}.__str__ raised>"


LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
"""What ``PIPELINE_LOG_LEVEL`` takes (any case)."""
FORMATS = ("text", "json")
"""What ``PIPELINE_LOG_FORMAT`` takes (any case)."""


def logging_from_environment() -> tuple[str, str]:
    """The level and format a command logs at, for :func:`configure_logging`.

    ``PIPELINE_LOG_LEVEL`` (default ``WARNING``) and ``PIPELINE_LOG_FORMAT`` (default ``text``).
    """
    return (
        os.environ.get("PIPELINE_LOG_LEVEL", "WARNING"),
        os.environ.get("PIPELINE_LOG_FORMAT", "text"),
    )


def configure_logging(level: str, fmt: str = "text", worker: int | None = None) -> None:
    """Log to stderr at ``level``, one line per record, repeated warnings backed off.

    ``fmt`` is ``text`` (the default) or ``json`` (one object per line); either way each record
    carries the current ``trace_id`` and ``span_id`` (:mod:`pipeline.tracing.logs`). ``worker``,
    in a worker process of ``pipeline ingress serve --workers N``, is its index, on every line
    (`` worker=I``; ``"worker": I``), librdkafka's too, so the workers' lines are told apart.
    Raises :class:`ConfigError` naming the variable for a level or format that is not one.
    """
    from pipeline.tracing.logs import (  # noqa: PLC0415 - no cycle at import
        JsonFormatter,
        TextFormatter,
        TraceFilter,
        WorkerFilter,
    )

    if level.upper() not in LEVELS:
        raise ConfigError(
            f"PIPELINE_LOG_LEVEL={level!r} is not a log level: use {', '.join(LEVELS)}"
        )
    if fmt.lower() not in FORMATS:
        raise ConfigError(f"PIPELINE_LOG_FORMAT={fmt!r} is not a log format: use text or json")
    logging.basicConfig(
        level=level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )
    # httpx logs every request's whole URL at INFO; a presigned S3 request's (the payload
    # store's deletes) carries a short-lived credential in its query.
    logging.getLogger("httpx").setLevel(max(logging.WARNING, logging.getLogger().level))
    repeats, traces = RepeatFilter(), TraceFilter()
    for handler in logging.getLogger().handlers:
        handler.addFilter(repeats)
        handler.addFilter(traces)
        if worker is not None:
            handler.addFilter(WorkerFilter(worker))
        handler.setFormatter(JsonFormatter() if fmt.lower() == "json" else TextFormatter())
