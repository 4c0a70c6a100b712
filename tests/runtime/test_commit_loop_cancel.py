"""A member's shutdown ends its commit loop even when a cancellation is absorbed below it."""

from __future__ import annotations

import asyncio

from support import LosesFirstCancel

from pipeline.cancel_tasks import cancel_until_done


async def test_a_cancellation_absorbed_below_the_task_is_sent_again() -> None:
    """A loop that loses its first cancellation is cancelled again until it ends.

    asyncio.wait_for under redis-py can lose one on Python 3.11 (CPython issue 86296); the
    shutdown used to wait on the commit loop for ever then.
    """
    commit_forever = LosesFirstCancel()
    task = asyncio.create_task(commit_forever.run())
    await asyncio.sleep(0)
    await asyncio.wait_for(cancel_until_done(task), 10)
    assert task.cancelled()
    assert commit_forever.absorbed == 1
