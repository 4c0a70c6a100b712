"""`pipeline throttle status` of an adaptive key a Retry-After closed, and of no active key."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import pytest
from redis.asyncio import Redis
from support import own_throttle

from pipeline.admission import keys
from pipeline.admission.adaptive import feedback_for
from pipeline.admission.cli import _limit_cell
from pipeline.admission.status import ThrottleStatus
from pipeline.admission.throttle import Throttle
from pipeline.topics.spec import AdaptivePolicy

pytestmark = pytest.mark.redis

POLICY = AdaptivePolicy.model_validate({"min": 1, "max": 8, "decrease": 0.5, "cooldown": "1h"})
KEY = "dep:vision"

throttle = own_throttle(default_limit=2)
"""A started throttle in a namespace of the test's own (keys under the prefix ``tUNIQUE``)."""


def status(redis_url: str, unique: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``pipeline throttle status ARGS`` on the test's namespace, as an operator runs it."""
    return subprocess.run(
        [sys.executable, "-m", "pipeline", "throttle", "status", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={
            **os.environ,
            "PIPELINE_REDIS__URL": redis_url,
            "PIPELINE_REDIS__KEY_PREFIX": f"t{unique}",
            "PIPELINE_THROTTLE__NAMESPACE": unique,
            "COLUMNS": "200",  # the whole table on one line a row
        },
        check=False,
    )


async def test_a_key_closed_by_a_retry_after_shows_until_when_and_its_window(
    throttle: Throttle, redis_service: str, unique: str
) -> None:
    """Closed for 10 minutes with a window of 2: status says so, not a bare ``limit 0``."""
    await throttle.set_limit(KEY, 4)
    permit = await throttle.acquire([KEY])
    before_ms = int(time.time() * 1000)
    feedback = feedback_for([KEY], {KEY: POLICY}, duration_s=0.1, throttled=True, retry_after_s=600)
    await throttle.release(permit, feedback)  # the window 4 is cut to 2, the key closed
    assert await throttle.try_acquire([KEY]) is None  # closed: no room, nothing queued

    as_json = status(redis_service, unique, KEY, "--json")
    assert as_json.returncode == 0, as_json.stderr
    shown = json.loads(as_json.stdout)
    assert shown["limit"] == 0
    closed = shown["closed"]
    assert closed["reopen_limit"] == 2
    # Redis's clock: a loaded machine's skew is far under a minute either way.
    assert before_ms + 540_000 < closed["until_ms"] < before_ms + 660_000

    # Listed among the keys, though nothing holds or waits on it now.
    listed = status(redis_service, unique, "--json")
    assert listed.returncode == 0, listed.stderr
    assert [json.loads(line)["key"] for line in listed.stdout.splitlines()] == [KEY]

    table = status(redis_service, unique)
    assert table.returncode == 0, table.stderr
    (row,) = [line for line in table.stdout.splitlines() if KEY in line]
    until = time.strftime("%H:%M:%S", time.gmtime(closed["until_ms"] / 1000))
    # How long is left depends on when the command ran: "in 10m", "in 9m 59s", ...
    assert re.search(rf"│ 0, closed until {until} UTC \(in (10m|9m( \d+s)?)\), then 2 │", row), row


async def test_set_limit_opens_a_closed_key_and_status_shows_it_open(
    throttle: Throttle, redis_service: str, unique: str
) -> None:
    """After ``set-limit`` on a closed key, status shows the limit set and no closure."""
    await throttle.set_limit(KEY, 4)
    permit = await throttle.acquire([KEY])
    feedback = feedback_for([KEY], {KEY: POLICY}, duration_s=0.1, throttled=True, retry_after_s=600)
    await throttle.release(permit, feedback)
    await throttle.set_limit(KEY, 3)
    shown = status(redis_service, unique, KEY, "--json")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout) == {
        "key": KEY,
        "limit": 3,
        "holders": [],
        "waiters": {},
        "recent_grants": [],
    }


async def test_the_closed_and_aimd_names_are_those_the_script_writes(
    throttle: Throttle, redis_service: str, unique: str
) -> None:
    """``keys.closed`` and ``keys.aimd`` name the zset and hash ``lua/throttle.lua`` writes."""
    await throttle.set_limit(KEY, 4)
    permit = await throttle.acquire([KEY])
    feedback = feedback_for([KEY], {KEY: POLICY}, duration_s=0.1, throttled=True, retry_after_s=600)
    await throttle.release(permit, feedback)
    client = Redis.from_url(redis_service)
    try:
        until = await client.zscore(keys.closed(f"t{unique}", unique), KEY)
        window = await client.hget(keys.aimd(f"t{unique}", unique, KEY), "limit")
    finally:
        await client.aclose()
    assert until is not None
    assert window is not None
    assert float(window) == 2


def test_no_active_key_is_no_json_line_and_exit_0(redis_service: str, unique: str) -> None:
    """As ``topics list --json``: zero keys is zero lines, exit 0; the table form says so."""
    as_json = status(redis_service, unique, "--json")
    assert (as_json.returncode, as_json.stdout, as_json.stderr) == (0, "", "")
    table = status(redis_service, unique)
    assert (table.returncode, table.stdout) == (0, "no active throttle keys\n")


def test_redis_out_of_reach_is_exit_1_and_one_line(unique: str) -> None:
    """A failure is told apart from nothing active: exit 1, nothing on stdout, one stderr line."""
    as_json = status("redis://127.0.0.1:1", unique, "--json")
    assert as_json.returncode == 1
    assert as_json.stdout == ""
    (line,) = as_json.stderr.strip().splitlines()
    assert line.startswith("error: cannot reach Redis at redis://127.0.0.1:1")


def test_a_closure_past_due_says_the_next_call_reopens_it() -> None:
    """Reopening is lazy: a time past, not reopened yet, is shown as such, not as ``in -3s``."""
    closed = ThrottleStatus(
        key=KEY,
        limit=0,
        holders=(),
        waiters=(),
        recent_grants=(),
        closed_until_ms=1_765_000_000_000,
        reopen_limit=3,
    )
    assert _limit_cell(closed, 1_765_000_003_000) == (
        "0, closed until 05:46:40 UTC (passed: the next call reopens it), then 3"
    )
    assert _limit_cell(closed, 1_764_999_990_000) == "0, closed until 05:46:40 UTC (in 10s), then 3"
