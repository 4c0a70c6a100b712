"""A CPU-bound handler for the failure-line test: one exception type, raised in two places."""

from __future__ import annotations

from pipeline.runtime import Context


def inner_a(event: bytes) -> None:
    """Where an event starting with ``a`` fails."""
    raise ValueError(f"bad a {event!r}")


def inner_b(event: bytes) -> None:
    """Where any other event fails."""
    raise ValueError(f"bad b {event!r}")


def crunch(event: bytes, ctx: Context) -> None:
    """Fail in :func:`inner_a` or :func:`inner_b`, by the event's first letter."""
    del ctx
    if event.startswith(b"a"):
        inner_a(event)
    inner_b(event)
