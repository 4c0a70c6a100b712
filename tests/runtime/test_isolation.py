"""The member-wide gate that runs suspects alone (``pipeline.runtime.isolation``)."""

from __future__ import annotations

import asyncio

from pipeline.runtime.isolation import Isolation


async def _enter(
    gate: Isolation, log: list[str], name: str, leave: asyncio.Event, *, alone: bool = False
) -> None:
    async with gate.alone() if alone else gate.shared():
        log.append(f"+{name}")
        await leave.wait()
        log.append(f"-{name}")


async def test_ordinary_runs_share_and_a_suspect_waits_for_them_then_runs_alone() -> None:
    """Runs overlap; a suspect lets those in progress finish, holds newcomers, runs alone."""
    gate = Isolation(alone_for_s=60)
    log: list[str] = []
    leave = {n: asyncio.Event() for n in ("a", "b", "s", "c")}
    a = asyncio.create_task(_enter(gate, log, "a", leave["a"]))
    b = asyncio.create_task(_enter(gate, log, "b", leave["b"]))
    await asyncio.sleep(0)
    assert log == ["+a", "+b"]  # ordinary runs overlap
    s = asyncio.create_task(_enter(gate, log, "s", leave["s"], alone=True))
    await asyncio.sleep(0)
    c = asyncio.create_task(_enter(gate, log, "c", leave["c"]))
    await asyncio.sleep(0)
    assert log == ["+a", "+b"]  # the suspect and the newcomer wait
    assert gate.suspects == 1
    leave["a"].set()
    leave["b"].set()
    await asyncio.wait_for(asyncio.shield(a), 5)
    await asyncio.wait_for(asyncio.shield(b), 5)
    for _ in range(5):
        await asyncio.sleep(0)
    assert log == ["+a", "+b", "-a", "-b", "+s"]  # alone: c still waits
    leave["s"].set()
    leave["c"].set()
    await asyncio.wait_for(asyncio.gather(s, c), 5)
    assert log[-3:] == ["-s", "+c", "-c"]
    assert gate.suspects == 0


async def test_suspects_run_one_at_a_time() -> None:
    """Two suspects never overlap."""
    gate = Isolation(alone_for_s=60)
    log: list[str] = []
    leave = {n: asyncio.Event() for n in ("s1", "s2")}
    s1 = asyncio.create_task(_enter(gate, log, "s1", leave["s1"], alone=True))
    s2 = asyncio.create_task(_enter(gate, log, "s2", leave["s2"], alone=True))
    for _ in range(5):
        await asyncio.sleep(0)
    assert log == ["+s1"]
    leave["s1"].set()
    leave["s2"].set()
    await asyncio.wait_for(asyncio.gather(s1, s2), 5)
    assert log == ["+s1", "-s1", "+s2", "-s2"]


async def test_a_hanging_suspect_holds_the_others_back_only_for_a_while() -> None:
    """Past ``alone_for_s`` the others run again beside a suspect that has not finished."""
    gate = Isolation(alone_for_s=0.05)
    log: list[str] = []
    hang, other = asyncio.Event(), asyncio.Event()
    s = asyncio.create_task(_enter(gate, log, "s", hang, alone=True))
    for _ in range(3):
        await asyncio.sleep(0)
    c = asyncio.create_task(_enter(gate, log, "c", other))
    other.set()
    await asyncio.wait_for(c, 5)  # let through once alone_for_s passed, while s still runs
    assert log == ["+s", "+c", "-c"]
    hang.set()
    await asyncio.wait_for(s, 5)
