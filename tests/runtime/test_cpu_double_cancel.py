"""A cpu=True call cancelled twice (a second signal at shutdown) leaves its pool whole."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from pipeline.runtime.cpu import ProcessPool

REF = f"{__name__}:mark_then_sleep"


def mark_then_sleep(mark: str, seconds: float) -> None:
    """Runs in a worker: create ``mark``, then sleep past SIGTERM (only SIGKILL ends it)."""
    Path(mark).touch()
    time.sleep(seconds)


async def _until(check: object, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)


def _stopping() -> bool:
    """Whether a worker's stop (SIGTERM, then SIGKILL after the grace) is under way."""
    return any(t.get_coro().__qualname__ == "ProcessPool._stop" for t in asyncio.all_tasks())  # type: ignore[union-attr]


async def test_a_call_cancelled_again_while_its_worker_stops_keeps_one_worker_per_slot(
    tmp_path: Path,
) -> None:
    """The second cancellation lands while the first stops the worker (SIGTERM, the grace).

    The call used to put the worker it was stopping back into the idle queue, dead, while the
    stop went on to start a fresh worker that no queue held: the pool ran one process more than
    its size for as long as it lived, and the next call met a dead worker first.
    """
    pool = ProcessPool(1, grace_s=1.0)
    try:
        mark = tmp_path / "began"
        call = asyncio.create_task(pool.run(REF, (str(mark), 60.0), 120.0))
        await _until(mark.exists)
        (worker,) = pool._all
        call.cancel()
        await _until(_stopping)  # the call now waits for its stop (the handler ignores SIGTERM)
        call.cancel()
        await asyncio.wait({call})
        assert call.cancelled()
        # The stop finishes in the background: SIGKILL after the grace, a fresh worker.
        await _until(lambda: worker not in pool._all and len(pool._all) == 1)
        await _until(lambda: pool._idle.qsize() == 1)
        (fresh,) = pool._all
        assert fresh.process.is_alive()
        again = tmp_path / "again"
        await pool.run(REF, (str(again), 0.0), 60.0)
        assert again.exists()
        assert len(pool._all) == 1, "one worker per slot, no orphan"
        assert all(w.process.is_alive() for w in pool._all)
    finally:
        await pool.close()
