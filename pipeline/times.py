"""How the pipeline writes an instant: one format for every command, report and log line.

:func:`utc_time` is what the commands print and what ``--since``/``--until`` read back
(:func:`pipeline.redrive.select.parse_time_ms` reads it). Standard library only, so any layer
may import it without the command-line modules (typer, rich).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Final

__all__ = ["utc_time"]

_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)


def utc_time(ms: int) -> str:
    """``ms`` since the epoch as every command prints an instant: ``2026-12-07T05:40:00.123Z``.

    ISO 8601 in UTC, to the millisecond, with ``Z``: what ``--since`` and ``--until`` read back.
    A number no calendar date holds (years 1 to 9999 only; a producer may set a message's time
    to anything) is ``at N ms``.
    """
    try:
        moment = _EPOCH + timedelta(milliseconds=ms)
    except OverflowError:
        return f"at {ms} ms"
    return moment.isoformat(timespec="milliseconds").removesuffix("+00:00") + "Z"
