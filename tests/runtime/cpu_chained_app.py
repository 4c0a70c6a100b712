"""CPU-bound handlers for the chain-clearing tests: one library instance raised again and again."""

from __future__ import annotations

import asyncio

from pipeline.runtime import Context


class LibraryError(Exception):
    """A library's error, one instance of which it raises each time."""


LIBRARY = LibraryError("the library's one instance")
"""Raised by :func:`_library_call` each time; it reaches the worker as a cause or in a group."""


class Reused(Exception):
    """The app's error, one instance of which is raised again and again."""


REUSED = Reused("the one instance")


def _library_call() -> None:
    """A library's call that fails with its one instance, a large local kept by its frame."""
    buffer = bytearray(1_000_000)
    del buffer
    raise LIBRARY


def wrapped(event: bytes, ctx: Context | None) -> None:
    """Raise a RuntimeError whose cause is :data:`LIBRARY`."""
    del event, ctx
    try:
        _library_call()
    except LibraryError as exc:
        raise RuntimeError("the library failed") from exc


def grouped(event: bytes, ctx: Context | None) -> None:
    """Raise an ExceptionGroup of :data:`LIBRARY`, out of a TaskGroup."""
    del event, ctx

    async def call() -> None:
        _library_call()

    async def main() -> None:
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(call())

    asyncio.run(main())


def depth(event: bytes, ctx: Context | None) -> None:
    """Fail with how many frames :data:`LIBRARY`'s traceback holds in this worker."""
    del event, ctx
    frames = 0
    tb = LIBRARY.__traceback__
    while tb is not None:
        frames += 1
        tb = tb.tb_next
    raise RuntimeError(f"frames={frames}")


def _parse(event: bytes) -> None:
    """A parse of ``event`` that fails, naming it."""
    raise ValueError(f"bad field in event {event!r}")


def stale(event: bytes, ctx: Context | None) -> None:
    """Raise :data:`REUSED`, for event ``first`` while handling a ValueError naming the event."""
    del ctx
    if event == b"first":
        try:
            _parse(event)
        except ValueError:
            raise REUSED  # noqa: B904 - the ValueError is its context, as an app's would be
    raise REUSED
