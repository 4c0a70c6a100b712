"""A command stopped by SIGTERM ends although its first cancellation was lost below it."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest
import typer
from support import LosesFirstCancel

from pipeline.cli_support import until_stopped


async def test_a_sigterm_whose_cancellation_is_absorbed_still_ends_the_command() -> None:
    """The command's loop loses its first cancellation, and SIGTERM still ends it (exit 143).

    A redis-py read under ``asyncio.wait_for`` loses one on Python 3.11 (CPython issue 86296):
    `pipeline tail` on Redis Streams then read on after SIGTERM and never exited.
    """
    read_forever = LosesFirstCancel()

    said: list[str] = []

    def say(by: str) -> str:
        said.append(by)
        return f"stopped by {by}"

    async def command() -> None:
        stopped = asyncio.ensure_future(until_stopped(read_forever.run(), say))
        await asyncio.wait_for(read_forever.running.wait(), 10)
        os.kill(os.getpid(), signal.SIGTERM)
        done, _ = await asyncio.wait([stopped], timeout=10)  # not wait_for: see the docstring
        assert done, "the command read on after SIGTERM"
        await stopped

    with pytest.raises(typer.Exit) as stop:
        await command()
    assert stop.value.exit_code == 143
    assert read_forever.absorbed == 1
    assert said == ["SIGTERM"]
