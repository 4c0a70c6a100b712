"""A CPU-bound handler for the worker-note tests: one instance raised each time, and groups."""

from __future__ import annotations

from pipeline.runtime import Context


class Reused(Exception):
    """The app's error, one instance of which is raised again and again."""


REUSED = Reused("the one instance")


def inner_a(event: bytes) -> None:
    """Where a group's sub-exception of an event ``ga`` is raised."""
    raise ValueError(f"leaf a {event!r}")


def inner_b(event: bytes) -> None:
    """Where a group's sub-exception of any other event starting with ``g`` is raised."""
    raise ValueError(f"leaf b {event!r}")


def crunch(event: bytes, ctx: Context | None) -> None:
    """Raise a group of one ValueError for ``g...`` events, else :data:`REUSED`."""
    del ctx
    if event.startswith(b"g"):
        try:
            (inner_a if event == b"ga" else inner_b)(event)
        except ValueError as exc:
            raise ExceptionGroup("the crunch failed", [exc]) from None
    raise REUSED
