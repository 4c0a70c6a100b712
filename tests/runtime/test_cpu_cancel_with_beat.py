"""A cpu=True call's cancellation is never lost to a message its worker sends at that moment."""

from __future__ import annotations

import asyncio
import multiprocessing
import os

from pipeline.runtime import cpu


async def test_a_call_cancelled_as_its_worker_beats_is_cancelled() -> None:
    """A call cancelled in the loop turn in which its worker's heartbeat arrives still stops.

    The member waited for its worker's pipe under ``asyncio.wait_for``, which on Python 3.11
    returns the result and drops a cancellation that lands once the awaited thing is done
    (CPython issue 86296): the stop was lost, the worker never got SIGTERM, and the run went
    on for as long as its handler did.
    """
    loop = asyncio.get_running_loop()
    member_end, worker_end = multiprocessing.Pipe(duplex=False)
    stop_r, stop_w = os.pipe()
    waiting = asyncio.create_task(cpu._readable(member_end, 60.0))

    def stop() -> None:  # the member's stop of the run, in the turn the worker's beat comes in
        loop.remove_reader(stop_r)
        waiting.cancel()

    def beat_and_stop() -> None:  # runs once the call waits for its pipe (its first step)
        loop.add_reader(stop_r, stop)
        worker_end.send(("beat", None))
        os.write(stop_w, b"x")

    loop.call_soon(beat_and_stop)
    try:
        await asyncio.wait({waiting})
    finally:
        loop.remove_reader(stop_r)
        for fd in (stop_r, stop_w):
            os.close(fd)
        member_end.close()
        worker_end.close()
    assert waiting.cancelled()
