"""Log records that carry the current trace, and the JSON log format.

:class:`TraceFilter` adds ``trace_id`` and ``span_id`` (hex, "" outside a span or with tracing
off) to every record, so a log line can be found from its trace and back. :class:`TextFormatter`
is the plain one-line format with `` trace=<trace_id> span=<span_id>`` appended when a record has
them (so with tracing off a line is as it always was), and `` worker=<index>`` in an ingress
worker process (:class:`WorkerFilter`).
:class:`JsonFormatter` writes one JSON object per line (``PIPELINE_LOG_FORMAT=json``) with the
time, level, logger, message, the trace fields and whatever ``extra`` the call passed (a value
JSON cannot hold, such as NaN or a dict keyed by tuples, as its text).
"""

from __future__ import annotations

import json
import logging
import math
import time
from typing import Any

from pipeline.tracing import spans
from pipeline.tracing.record import CURRENT

# The attributes every LogRecord has; anything else on a record came from ``extra=``.
_STANDARD = frozenset(logging.makeLogRecord({}).__dict__) | {"message", "asctime"}


class TraceFilter(logging.Filter):
    """Adds ``trace_id`` and ``span_id`` of the current span to each record."""

    def filter(self, record: logging.LogRecord) -> bool:
        """Always True: the record is annotated, never dropped."""
        record.trace_id = record.span_id = ""
        if spans.on():
            current = CURRENT.get()
            if current is not None:
                record.trace_id = format(current.trace_id, "032x")
                record.span_id = format(current.span_id, "016x")
        return True


class WorkerFilter(logging.Filter):
    """Adds ``worker``, the index of the ingress worker process that logs, to each record."""

    def __init__(self, index: int) -> None:
        """The filter of worker ``index``'s handlers."""
        super().__init__()
        self._index = index

    def filter(self, record: logging.LogRecord) -> bool:
        """Always True: the record is annotated, never dropped."""
        record.worker = self._index
        return True


class TextFormatter(logging.Formatter):
    """``time level logger message``, plus the trace and span ids when the record has them.

    A worker process's line ends with `` worker=<index>`` (:class:`WorkerFilter`).
    """

    def __init__(self) -> None:
        """The project's one-line format."""
        super().__init__("%(asctime)s %(levelname)s %(name)s %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        """The line, with `` trace=... span=...`` when logged inside a recorded span."""
        line = super().format(record)
        trace_id = getattr(record, "trace_id", "")
        if trace_id:
            line = f"{line} trace={trace_id} span={getattr(record, 'span_id', '')}"
        worker = getattr(record, "worker", None)
        return line if worker is None else f"{line} worker={worker}"


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time, level, logger, message, trace ids, extras."""

    def format(self, record: logging.LogRecord) -> str:
        """The record as a JSON line (exceptions as a ``traceback`` string)."""
        doc: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        doc.update(
            (name, value)
            for name, value in record.__dict__.items()
            if name not in _STANDARD and not name.startswith("_")
        )
        if record.exc_info:
            doc["traceback"] = self.formatException(record.exc_info)
        try:
            return json.dumps(doc, default=str, allow_nan=False)
        except (TypeError, ValueError):  # NaN, infinity, a key no JSON has, a value holding itself
            return json.dumps({name: _plain(value) for name, value in doc.items()})


def _plain(value: object) -> object:
    """``value`` if JSON holds it as it is, else its text."""
    if value is None or isinstance(value, (str, bool, int)):
        return value
    if isinstance(value, float) and math.isfinite(value):
        return value
    return str(value)
