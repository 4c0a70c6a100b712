"""``pipeline throttle status`` and ``set-limit`` against a real Redis."""

from __future__ import annotations

import asyncio
import json
import os
import sys

import pytest
from redis.asyncio import Redis
from runtime.helpers import eventually

from pipeline.admission.cli import _reserve_cell
from pipeline.admission.status import ThrottleStatus
from pipeline.admission.throttle import Throttle

pytestmark = pytest.mark.redis


async def _cli(*args: str, env: dict[str, str]) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "pipeline",
        "throttle",
        *args,
        env={**os.environ, **env},
        stdout=asyncio.subprocess.PIPE,
    )
    out, _ = await proc.communicate()
    return proc.returncode or 0, out.decode()


async def _throttle(
    redis_service: str, namespace: str, limit: int
) -> tuple[dict[str, str], Redis, Throttle]:
    """The CLI's environment for ``namespace`` and a started throttle member on it."""
    env = {
        "PIPELINE_REDIS__URL": redis_service,
        "PIPELINE_THROTTLE__NAMESPACE": namespace,
        "PIPELINE_THROTTLE__DEFAULT_LIMIT": str(limit),
    }
    client = Redis.from_url(redis_service)
    throttle = Throttle(client, namespace=namespace, default_limit=limit)
    await throttle.start()
    return env, client, throttle


async def test_status_shows_holders_and_waiters_per_priority(redis_service, unique):
    """Status lists the limit, holders, waiters per priority and grants; set-limit wakes one."""
    env, client, throttle = await _throttle(redis_service, f"c{unique}", 1)
    held = await throttle.acquire(["org:acme"])
    waiting = [asyncio.create_task(throttle.acquire(["org:acme"], priority=p)) for p in (1, 5, 5)]
    await eventually(lambda: throttle.waited == 3, 10)
    code, out = await _cli("status", "--json", env=env)
    assert code == 0
    (line,) = out.splitlines()
    shown = json.loads(line)
    assert shown["key"] == "org:acme"
    assert shown["limit"] == 1
    assert [h["holder"] for h in shown["holders"]] == [held.holder]
    assert shown["waiters"] == {"5": 2, "1": 1}
    assert shown["recent_grants"][0]["holder"] == held.holder
    code, _ = await _cli("set-limit", "org:acme", "3", env=env)
    assert code == 0
    done, _ = await asyncio.wait(waiting, timeout=10, return_when=asyncio.FIRST_COMPLETED)
    assert {t.result().priority for t in done} == {5}
    await eventually(lambda: sum(t.done() for t in waiting) == 2, 10)
    assert not waiting[0].done()  # priority 1 still waits: 3 slots, 3 holders
    for t in waiting:
        t.cancel()
    await asyncio.gather(*waiting, return_exceptions=True)
    await throttle.close()
    await client.aclose()


async def test_status_into_a_pipe_keeps_long_keys_whole(redis_service, unique):
    """Piped, the status table prints a 100-character key on one line instead of wrapping at 80."""
    env = {"PIPELINE_REDIS__URL": redis_service, "PIPELINE_THROTTLE__NAMESPACE": f"w{unique}"}
    key = "org:" + "k" * 96
    client = Redis.from_url(redis_service)
    throttle = Throttle(client, namespace=f"w{unique}", default_limit=1)
    await throttle.start()
    try:
        held = await throttle.acquire([key])
        code, out = await _cli("status", env=env)
        assert code == 0
        assert key in out
        await throttle.release(held)
    finally:
        await throttle.close()
        async for name in client.scan_iter(match=f"*w{unique}*"):
            await client.delete(name)
        await client.aclose()


def test_the_reserve_column_gives_the_kept_slots_and_how_often_they_queued():
    """``4 for p5+, 3/400 queued (0.75 %)``; ``-`` for a key that never kept a reserve."""
    plain = ThrottleStatus("org:acme", 2, (), (), ())
    assert _reserve_cell(plain) == "-"
    kept = ThrottleStatus("pool", 16, (), (), (), reserve=(4, 5))
    assert _reserve_cell(kept) == "4 for p5+"
    used = ThrottleStatus("pool", 16, (), (), (), (4, 5), reserved_asked=400, reserved_queued=3)
    assert _reserve_cell(used) == "4 for p5+, 3/400 queued (0.75 %)"
    dropped = ThrottleStatus("pool", 16, (), (), (), None, reserved_asked=10, reserved_queued=0)
    assert _reserve_cell(dropped) == "none now, 0/10 queued (0.00 %)"


async def test_set_reserve_keeps_slots_for_better_priorities_and_status_counts_them(
    redis_service, unique
):
    """``set-reserve pool 1 --min-priority 5`` lends one slot less to priority 0; bad input: 2."""
    env, client, throttle = await _throttle(redis_service, f"r{unique}", 2)
    try:
        code, out = await _cli("set-reserve", "pool", "1", "--min-priority", "5", env=env)
        assert (code, out.strip()) == (0, "pool: reserve 1 slots for priority 5 and up")
        low = await throttle.acquire(["pool"])
        borrowing = asyncio.create_task(throttle.acquire(["pool"]))
        await eventually(lambda: throttle.waited == 1, 10)
        high = await asyncio.wait_for(throttle.acquire(["pool"], priority=5), 10)
        code, out = await _cli("status", "pool", "--json", env=env)
        assert code == 0
        assert json.loads(out)["reserve"] == {
            "slots": 1,
            "min_priority": 5,
            "asked": 1,
            "queued": 0,
        }
        code, out = await _cli("set-reserve", "pool", env=env)
        assert (code, out.strip()) == (0, "pool: reserve none")
        assert not borrowing.done()  # the pool is full either way
        await throttle.release(high)
        await throttle.release(await asyncio.wait_for(borrowing, 10))
        await throttle.release(low)
        for bad in (["pool", "-1"], ["pool", "1", "--min-priority", "2000"]):
            code, _ = await _cli("set-reserve", *bad, env=env)
            assert code == 2
    finally:
        await throttle.close()
        async for name in client.scan_iter(match=f"*r{unique}*"):
            await client.delete(name)
        await client.aclose()


async def test_a_limit_or_reserve_too_large_is_refused_and_status_still_reads(
    redis_service, unique
):
    """A limit or reserve past what Redis keeps as an integer exits 2 in one line, not stored."""
    env, client, throttle = await _throttle(redis_service, f"b{unique}", 2)
    try:
        for bad in (["set-limit", "pool", str(10**23)], ["set-reserve", "pool", str(10**23)]):
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "pipeline",
                "throttle",
                *bad,
                env={**os.environ, **env},
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
            _, stderr = await proc.communicate()
            assert proc.returncode == 2
            assert len(stderr.decode().strip().splitlines()) == 1
            assert "must be" in stderr.decode()
        code, out = await _cli("status", "pool", "--json", env=env)
        assert code == 0
        assert json.loads(out)["limit"] == 2
    finally:
        await throttle.close()
        async for name in client.scan_iter(match=f"*b{unique}*"):
            await client.delete(name)
        await client.aclose()


@pytest.mark.parametrize(
    "args", [["set-limit", "", "3"], ["set-reserve", " ", "1"], ["status", ""]], ids=str
)
async def test_an_empty_key_is_refused_in_one_line(redis_service, unique, args):
    """An empty key (a variable left unset) is one line and exit 2, nothing stored or listed.

    Before, set-limit stored a limit on a key no lane's template can make, and status '' listed
    every active key as if no key had been given.
    """
    env = {"PIPELINE_REDIS__URL": redis_service, "PIPELINE_THROTTLE__NAMESPACE": f"e{unique}"}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        *("-m", "pipeline", "throttle", *args),
        env={**os.environ, **env},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate()
    assert proc.returncode == 2
    assert out == b""
    (line,) = err.decode().strip().splitlines()
    assert "the throttle key is empty" in line
    client = Redis.from_url(redis_service)
    try:
        assert [name async for name in client.scan_iter(match=f"*e{unique}*")] == []
    finally:
        await client.aclose()
