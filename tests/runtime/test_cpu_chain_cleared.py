"""A CPU worker keeps nothing of a failure it sent back: no traceback in its chain, no context.

A worker sends an exception back to the member and drops its traceback. Before, only the
top-level exception's was dropped:

* a library's one instance, raised again and again as the cause of the handler's error or in
  its ExceptionGroup, kept every frame it passed through (and their locals) for the worker's
  life: 2 frames more per failure;
* the app's one instance raised again kept the ``__context__`` of an earlier failure: the next
  failure's note printed the earlier event's exception and its data.
"""

from __future__ import annotations

import pytest
from runtime import cpu_chained_app

from pipeline.runtime.cpu import ProcessPool, function_ref


async def _failed(pool: ProcessPool, handler: object, event: bytes) -> BaseException:
    """The exception ``handler`` raised in ``pool`` for ``event``."""
    with pytest.raises(Exception) as raised:  # noqa: PT011 - every failure is wanted here
        await pool.run(function_ref(handler), (event, None), 60)
    return raised.value


@pytest.mark.parametrize("handler", [cpu_chained_app.wrapped, cpu_chained_app.grouped])
async def test_an_instance_deep_in_the_chain_keeps_no_traceback(handler: object) -> None:
    """5 failures with the library's instance as a cause or in a group: it keeps no frame."""
    pool = ProcessPool(1, grace_s=1.0)
    try:
        for _ in range(5):
            await _failed(pool, handler, b"x")
        frames = await _failed(pool, cpu_chained_app.depth, b"x")
    finally:
        await pool.close()
    assert str(frames) == "frames=0"


async def test_an_instance_raised_again_keeps_no_earlier_context() -> None:
    """The app's instance raised for ``first`` then ``second``: the second note is its own."""
    pool = ProcessPool(1, grace_s=1.0)
    try:
        first = await _failed(pool, cpu_chained_app.stale, b"first")
        second = await _failed(pool, cpu_chained_app.stale, b"second")
    finally:
        await pool.close()
    assert "bad field in event b'first'" in "\n".join(first.__notes__)
    (note,) = second.__notes__
    assert "ValueError" not in note
    assert "first" not in note
    assert "raised in stale (" in note.splitlines()[0]
