"""A metrics source that fails as it is cut off leaves no error unread.

``asyncio.wait_for`` ran the refresh in a task of its own: when the refresher was cancelled
(the server closing) while a refresh waited on Redis, and the refresh's client raised its own
error on the way out (the connection closed), that error was never read, and asyncio logged
"Task exception was never retrieved" with the whole traceback (an ingress stopped in the
README's walk-through).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging

import pytest

from pipeline.errors import BrokerUnavailable
from pipeline.observability.metrics import Metrics
from pipeline.observability.server import MetricsServer


class _FailsWhenCutOff:
    """A source whose refresh waits until cancelled, then fails as a client cut off does."""

    name = "lag"

    async def refresh(self) -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            raise BrokerUnavailable("lag of 'orders': redis unreachable: closed") from None


async def test_a_refresh_cut_off_by_the_servers_close_leaves_no_error_unread() -> None:
    """The refresher cancelled mid-refresh: nothing is left for asyncio to log later."""
    unread: list[dict[str, object]] = []
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(lambda _loop, context: unread.append(context))
    try:
        server = MetricsServer(Metrics(), [_FailsWhenCutOff()], source_timeout_s=60)
        refreshing = asyncio.create_task(server.refresh_once())
        await asyncio.sleep(0.05)  # the refresh is waiting on its (fake) Redis
        refreshing.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await refreshing
        gc.collect()
        await asyncio.sleep(0)
    finally:
        loop.set_exception_handler(None)
    assert unread == []


async def test_a_source_failing_as_its_timeout_cuts_it_off_is_one_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The refresh counts as failed, on one line."""
    server = MetricsServer(Metrics(), [_FailsWhenCutOff()], source_timeout_s=0.01)
    with caplog.at_level(logging.WARNING, logger="pipeline.observability.server"):
        assert not await server.refresh_once()
    (line,) = [r.getMessage() for r in caplog.records]
    assert line.startswith("metrics source lag ")
