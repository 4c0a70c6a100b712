"""The CPU pool keeps its size when a worker that replaces a stopped one cannot be started."""

from __future__ import annotations

import asyncio
import errno
import time
from pathlib import Path
from typing import Any

import pytest
from runtime.helpers import eventually

from pipeline.runtime import cpu
from pipeline.runtime.cpu import ProcessPool

REF = f"{__name__}:mark_then_sleep"


def mark_then_sleep(mark: str, seconds: float) -> None:
    """Runs in a worker: create ``mark``, then sleep past SIGTERM (only SIGKILL ends it)."""
    Path(mark).touch()
    time.sleep(seconds)


def _fail_next_spawn(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Make the next worker start fail as fork does at a pid or memory limit; ``[n]`` starts."""
    real = cpu._Worker
    armed = [1]

    def flaky(ctx: Any) -> cpu._Worker:
        if armed:
            armed.pop()
            raise BlockingIOError(errno.EAGAIN, "Resource temporarily unavailable")
        return real(ctx)

    monkeypatch.setattr(cpu, "_Worker", flaky)
    return armed


async def _runs_on_its_one_worker(pool: ProcessPool, tmp_path: Path) -> None:
    """The next call runs, and the pool is back to its one worker."""
    again = tmp_path / "again"
    await asyncio.wait_for(pool.run(REF, (str(again), 0.0), 60.0), 60)
    assert again.exists()
    assert len(pool._all) == 1


async def test_a_cancelled_calls_worker_whose_replacement_failed_to_start_is_replaced_later(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A stop whose fresh worker failed to start (fork's EAGAIN) lost its slot for good.

    With one worker, every later call then waited for an idle worker for ever (beating all the
    while, so nothing took the runs for stuck): the lane stopped, with its member alive.
    """
    pool = ProcessPool(1, grace_s=0.2)
    try:
        mark = tmp_path / "began"
        call = asyncio.create_task(pool.run(REF, (str(mark), 60.0), 120.0))
        await eventually(mark.exists)
        armed = _fail_next_spawn(monkeypatch)
        call.cancel()
        await asyncio.wait({call})
        await eventually(lambda: not armed)  # the replacement's start failed
        await _runs_on_its_one_worker(pool, tmp_path)
    finally:
        await pool.close()


async def test_a_timed_out_calls_worker_whose_replacement_failed_to_start_is_replaced_later(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The call past its limit fails as it should; the pool is whole again for the next."""
    pool = ProcessPool(1, grace_s=0.2)
    try:
        await pool.run(REF, (str(tmp_path / "warm"), 0.0), 60.0)
        armed = _fail_next_spawn(monkeypatch)
        with pytest.raises((cpu.HandlerTimeout, BlockingIOError)):
            await pool.run(REF, (str(tmp_path / "late"), 60.0), 0.2)
        assert not armed
        await _runs_on_its_one_worker(pool, tmp_path)
    finally:
        await pool.close()
