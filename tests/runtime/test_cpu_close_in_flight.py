"""The CPU pool starts no worker after close(), whatever was stopping or replacing one then."""

from __future__ import annotations

import asyncio
import errno
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from runtime.helpers import alive, eventually

from pipeline.runtime import cpu
from pipeline.runtime.cpu import ProcessPool

REF = f"{__name__}:mark_then_sleep"


def mark_then_sleep(mark: str, seconds: float) -> None:
    """Runs in a worker: create ``mark``, then sleep past SIGTERM (only SIGKILL ends it)."""
    Path(mark).touch()
    time.sleep(seconds)


def _record_spawns(monkeypatch: pytest.MonkeyPatch) -> list[cpu._Worker]:
    """Every worker the pool starts from now on, in order."""
    real = cpu._Worker
    spawned: list[cpu._Worker] = []

    def recorded(ctx: Any) -> cpu._Worker:
        worker = real(ctx)
        spawned.append(worker)
        return worker

    monkeypatch.setattr(cpu, "_Worker", recorded)
    return spawned


def _pool_tasks() -> set[asyncio.Task[Any]]:
    """The pool's tasks still going: stops, replacements, retried starts."""
    return {
        task
        for task in asyncio.all_tasks()
        if task.get_coro().__qualname__.startswith("ProcessPool.")  # type: ignore[union-attr]
    }


async def _busy_pool(
    tmp_path: Path, grace_s: float = 5.0
) -> tuple[ProcessPool, asyncio.Task[None]]:
    """A one-worker pool whose worker runs a call that sleeps past its SIGTERM."""
    pool = ProcessPool(1, grace_s=grace_s)
    mark = tmp_path / "began"
    call = asyncio.create_task(pool.run(REF, (str(mark), 60.0), 120.0))
    await eventually(mark.exists)
    return pool, call


async def test_a_stop_in_its_grace_period_at_close_starts_no_worker(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The cancelled call's stop went on after close(): its fresh worker joined the closed pool.

    It ran on, idle, in a pool nobody would close again (a member shutting down left it).
    """
    pool, call = await _busy_pool(tmp_path)
    spawned = _record_spawns(monkeypatch)
    call.cancel()  # its stop: SIGTERM, then the grace period (the handler ignores SIGTERM)
    try:
        await pool.close()
        await asyncio.wait({call})
        assert not _pool_tasks()
        assert not [w.process.pid for w in spawned if alive(w.process.pid or 0)]
        assert not pool._all
    finally:
        for worker in spawned:
            worker.kill()


async def test_a_replacement_starting_at_close_is_killed_once_started(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A fresh worker whose start was under way as close() ran was put in the closed pool."""
    pool, call = await _busy_pool(tmp_path, grace_s=0.1)
    real = cpu._Worker
    starting, go_on = threading.Event(), threading.Event()
    spawned: list[cpu._Worker] = []

    def held(ctx: Any) -> cpu._Worker:
        starting.set()
        go_on.wait(60)
        worker = real(ctx)
        spawned.append(worker)
        return worker

    monkeypatch.setattr(cpu, "_Worker", held)
    call.cancel()
    try:
        await eventually(starting.is_set)  # the stop's fresh worker, after the grace period
        closing = asyncio.create_task(pool.close())
        asyncio.get_running_loop().call_soon(go_on.set)  # once close() has begun
        await closing
        await asyncio.wait({call})
        assert not _pool_tasks()
        assert spawned, "the replacement was started"
        assert not [w.process.pid for w in spawned if alive(w.process.pid or 0)]
        assert not pool._all
    finally:
        go_on.set()
        for worker in spawned:
            worker.kill()


async def test_a_replacement_that_failed_to_start_at_close_is_not_tried_again(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """One whose start failed was started again every 5 s for ever, after close() had returned."""
    pool, call = await _busy_pool(tmp_path)
    tries: list[int] = []

    def failing(ctx: Any) -> cpu._Worker:  # fork's EAGAIN, at a pid limit
        tries.append(1)
        raise BlockingIOError(errno.EAGAIN, "Resource temporarily unavailable")

    monkeypatch.setattr(cpu, "_Worker", failing)
    call.cancel()
    await pool.close()
    await asyncio.wait({call})
    left = _pool_tasks()
    for task in left:
        task.cancel()
    assert not left, f"still going after close: {left}, {len(tries)} starts tried"
