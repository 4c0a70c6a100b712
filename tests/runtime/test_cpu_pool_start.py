"""The CPU pool's start: a worker that could not be started is started by a later call."""

from __future__ import annotations

import errno
from typing import Any

import pytest

from pipeline.runtime import cpu
from pipeline.runtime.cpu import ProcessPool


async def test_a_pool_whose_start_failed_once_starts_on_the_next_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One failed spawn at start (fork's EAGAIN) fails that call only, not every later one.

    The failed start was kept: every later call raised the same error for the member's life, so
    each message of every ``cpu=True`` lane went through its retries to the dead-letter topic.
    """
    real = cpu._Worker
    spawns: list[int] = []

    def flaky(ctx: Any) -> cpu._Worker:  # the second spawn fails, as fork does at a pid limit
        spawns.append(1)
        if len(spawns) == 2:
            raise BlockingIOError(errno.EAGAIN, "Resource temporarily unavailable")
        return real(ctx)

    monkeypatch.setattr(cpu, "_Worker", flaky)
    pool = ProcessPool(2, grace_s=0.5)
    try:
        with pytest.raises(BlockingIOError):
            await pool.run("os:getpid", (), 30.0)
        await pool.run("os:getpid", (), 30.0)
        await pool.run("os:getpid", (), 30.0)
        assert len(pool._all) == 2  # the one that failed, started again; no more
    finally:
        await pool.close()
