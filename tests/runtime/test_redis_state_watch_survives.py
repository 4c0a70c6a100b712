"""The state-loss watch survives a look that fails unforeseen, and says so.

:meth:`StateWatch.run` let any exception but a Redis failure end it: the member's reporting
task (run beside its progress lines with ``gather``) ended with it, nobody awaited that task
until shutdown, so no line said so at the time, and the watch never looked again: a later loss
went unseen. Now such a failure is one ERROR line with its traceback, and the watch looks again
at its next interval.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, cast

import pytest
from redis.asyncio import Redis
from runtime.helpers import lane_spec
from runtime.private_redis import bare_redis

from pipeline.runtime import App, Context
from pipeline.runtime.state_loss import StateWatch

LOGGER = "pipeline.runtime.state_loss"


class Unforeseen:
    """The real client, except that its next ``pipeline()`` calls fail as nothing foresaw."""

    def __init__(self, client: Redis, failures: int) -> None:
        """Fail the next ``failures`` calls of ``pipeline()``."""
        self.client = client
        self.failures = failures
        self.looks = asyncio.Event()

    def __getattr__(self, name: str) -> Any:
        """The client's other attributes, as they are."""
        return getattr(self.client, name)

    def pipeline(self, *args: Any, **kwargs: Any) -> Any:
        """A failure while any are left, else the client's pipeline."""
        self.looks.set()
        if self.failures:
            self.failures -= 1
            raise RuntimeError("unforeseen")
        return self.client.pipeline(*args, **kwargs)


async def test_an_unforeseen_failure_is_logged_and_the_watch_goes_on(
    unique: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Two failed looks: one ERROR line; the watch still runs and sees the FLUSHALL after."""
    name = f"sv_{unique}"
    app = App([lane_spec(name, 1, retry={"tiers": ["1s"]})])

    @app.handler(name)
    async def handle(event: bytes, ctx: Context) -> None:
        """Never called."""

    stop = asyncio.Event()
    with bare_redis() as server:
        client = Redis.from_url(server.url)
        flaky = Unforeseen(client, 0)
        watch = StateWatch(
            cast("Redis", flaky),
            server.url,
            f"t{unique}",
            "g-sv",
            [app.lanes[name]],
            interval_s=0.01,
        )
        try:
            await watch.start()
            flaky.failures = 2
            with caplog.at_level(logging.WARNING, logger=LOGGER):
                running = asyncio.create_task(watch.run(stop))
                while flaky.failures:  # the two failing looks
                    flaky.looks.clear()
                    await asyncio.wait_for(flaky.looks.wait(), 10)
                    assert not running.done(), running
                await client.flushall()
                deadline = time.monotonic() + 60
                while not any(r.levelno == logging.CRITICAL for r in caplog.records):
                    assert time.monotonic() < deadline, caplog.text
                    flaky.looks.clear()
                    await asyncio.wait_for(flaky.looks.wait(), 10)
                    assert not running.done(), running
                stop.set()
                await asyncio.wait_for(running, 10)
        finally:
            stop.set()
            await client.aclose()
    levels = [r.levelno for r in caplog.records]
    assert levels == [logging.ERROR, logging.CRITICAL], caplog.text
    error = caplog.records[0]
    assert error.exc_info is not None
    assert watch.key in error.getMessage()
