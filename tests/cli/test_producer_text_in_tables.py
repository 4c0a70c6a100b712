"""Text a producer chose (a tenant, a key) is printed as it is by the operators' tables.

rich reads ``[...]`` in a string as markup and ``:name:`` as an emoji code: a ``pl-tenant`` of
``org:[/x]`` stopped ``pipeline throttle status`` and ``pipeline status`` with a MarkupError
traceback (when a tenant floods, the moment they are needed), and ``:a:`` in a key printed as an
emoji. Each table cell and line with such text is literal now.
"""

from __future__ import annotations

import asyncio
import io
import os
import sys

import pytest
from redis.asyncio import Redis
from rich.console import Console
from runtime.helpers import eventually

from pipeline.admission.throttle import Throttle
from pipeline.cli.status import LaneStatus, Status
from pipeline.cli.status_view import render
from pipeline.observability.lanes import LaneReport

HOSTILE = "org:[/x]:a:[bold]t:smile:"
"""A closing tag with nothing open, emoji codes and an opening tag."""


def test_pipeline_status_prints_a_hostile_tenant_and_error_as_they_are() -> None:
    """A throttled tenant, a lane's error and the parts' errors: printed literally, no raise."""
    report = LaneReport("messages", "grp[/g]", 3, 1.0, {"1s": 0}, 0)
    status = Status(
        "kafka",
        (
            LaneStatus(report, throttled=((HOSTILE, 4),)),
            LaneStatus(
                LaneReport("replies", "replies", 0, 0.0, {}, 0), error=f"cannot read {HOSTILE}"
            ),
        ),
        log_error=f"log {HOSTILE}",
        throttle_error=f"throttle {HOSTILE}",
        cancellations={f"lane{HOSTILE}": {"hung": 1}},
    )
    out = io.StringIO()
    render(status, Console(file=out, width=400, color_system=None))
    text = out.getvalue()
    assert f"{HOSTILE} (4)" in text
    assert f"cannot read {HOSTILE}" in text
    assert "grp[/g]" in text
    assert f"log {HOSTILE}" in text
    assert f"throttle {HOSTILE}" in text
    assert f"lane{HOSTILE} cancelled 0, hung 1" in text


@pytest.mark.redis
async def test_throttle_status_prints_a_hostile_key_as_it_is(
    redis_service: str, unique: str
) -> None:
    """`pipeline throttle status` with a waiting key a producer named: exit 0, the key as sent."""
    namespace = f"mk{unique}"
    client = Redis.from_url(redis_service)
    throttle = Throttle(client, namespace=namespace, default_limit=1)
    await throttle.start()
    held = await throttle.acquire([HOSTILE])
    waiting = asyncio.create_task(throttle.acquire([HOSTILE]))
    try:
        await eventually(lambda: throttle.waited == 1, 10)
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "pipeline",
            "throttle",
            "status",
            env={
                **os.environ,
                "PIPELINE_REDIS__URL": redis_service,
                "PIPELINE_THROTTLE__NAMESPACE": namespace,
                "COLUMNS": "400",
            },
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await proc.communicate()
        assert proc.returncode == 0, err.decode()
        assert HOSTILE in out.decode()
    finally:
        await throttle.release(held)
        await throttle.release(await waiting)
        await throttle.close()
        async for name in client.scan_iter(match=f"*{namespace}*"):
            await client.delete(name)
        await client.aclose()
