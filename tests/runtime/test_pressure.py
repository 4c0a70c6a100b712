"""A member's concurrency under memory and CPU pressure (``pipeline.runtime.pressure``)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from pipeline.config import PressureSettings
from pipeline.envelope import Message
from pipeline.runtime.lanes import KeyLanes
from pipeline.runtime.pressure import ConcurrencyGovernor, LinuxProbe, Pressure, parse_psi

PSI = (
    "some avg10=12.50 avg60=3.00 avg300=1.00 total=123\n"
    "full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"
)
CALM = Pressure(cpu_psi=1.0, memory_psi=0.0, memory_used=0.3)


def _tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_psi_text_is_parsed() -> None:
    """The ``some avg10`` field of a PSI file; a file without one gives None."""
    assert parse_psi(PSI) == 12.5
    assert parse_psi("full avg10=3.00 avg60=0 avg300=0 total=0\n") is None


def test_cgroup_v2_readings_are_preferred(tmp_path: Path) -> None:
    """In a v2 container: the cgroup's PSI and memory against its limit."""
    root = _tree(
        tmp_path,
        {
            "sys/fs/cgroup/cpu.pressure": PSI,
            "sys/fs/cgroup/memory.pressure": PSI.replace("12.50", "40.00"),
            "sys/fs/cgroup/memory.current": "900",
            "sys/fs/cgroup/memory.max": "1000\n",
            "proc/pressure/cpu": PSI.replace("12.50", "99.00"),
            "proc/meminfo": "MemTotal: 16 kB\nMemAvailable: 8 kB\n",
        },
    )
    assert LinuxProbe(root).read() == Pressure(cpu_psi=12.5, memory_psi=40.0, memory_used=0.9)


def test_cgroup_v1_and_host_readings(tmp_path: Path) -> None:
    """v1 memory files (an unlimited cgroup counts against the host), host PSI."""
    root = _tree(
        tmp_path,
        {
            "sys/fs/cgroup/memory/memory.usage_in_bytes": str(4 * 1024),
            "sys/fs/cgroup/memory/memory.limit_in_bytes": str(2**63 - 4096),
            "proc/pressure/cpu": PSI,
            "proc/meminfo": "MemTotal: 16 kB\nMemAvailable: 8 kB\n",
        },
    )
    assert LinuxProbe(root).read() == Pressure(cpu_psi=12.5, memory_psi=None, memory_used=0.25)


def test_without_cgroup_files_the_host_memory_counts(tmp_path: Path) -> None:
    """No cgroup, no PSI (an older kernel): memory from /proc/meminfo, PSI unknown."""
    root = _tree(tmp_path, {"proc/meminfo": "MemTotal: 100 kB\nMemAvailable: 40 kB\n"})
    assert LinuxProbe(root).read() == Pressure(memory_used=0.6)


def test_this_host_can_be_read() -> None:
    """On the machine running the suite every available reading is a sane number."""
    reading = LinuxProbe().read()
    assert reading.memory_used is not None
    assert 0 < reading.memory_used < 1
    for psi in (reading.cpu_psi, reading.memory_psi):
        assert psi is None or 0 <= psi <= 100


def test_concurrency_shrinks_multiplicatively_and_grows_back_additively() -> None:
    """A quarter less per pressed reading down to the floor; one more per calm one."""
    applied: list[int] = []
    settings = PressureSettings(min_concurrency=4)
    governor = ConcurrencyGovernor(settings, 32, applied.append, probe=None)
    memory = Pressure(memory_used=0.95)
    assert [governor.step(memory) for _ in range(6)] == [24, 18, 13, 9, 6, 4]
    assert governor.pressed == ["memory_used"]
    assert governor.step(Pressure(cpu_psi=85.0)) == 4  # held at the floor
    assert [governor.step(CALM) for _ in range(3)] == [5, 6, 7]
    assert governor.pressed == []
    for _ in range(40):
        governor.step(CALM)
    assert governor.limit == 32
    assert applied[-1] == 32
    assert applied.count(32) == 1  # applied only when it changes


def test_each_threshold_counts_and_unknown_readings_are_ignored() -> None:
    """CPU PSI, memory PSI and memory use each press; a None reading never does."""
    governor = ConcurrencyGovernor(PressureSettings(), 8, lambda _n: None, probe=None)
    assert governor.over(Pressure(cpu_psi=80.0)) == ["cpu"]
    assert governor.over(Pressure(memory_psi=10.0)) == ["memory"]
    assert governor.over(Pressure(memory_used=0.9)) == ["memory_used"]
    assert governor.over(Pressure()) == []


def _msg(i: int) -> Message:
    return Message(topic="t", partition=0, offset=i, key=f"k{i}".encode(), value=b"")


async def test_lanes_run_no_more_than_the_lowered_limit_and_more_once_raised() -> None:
    """Lowering the limit lets running messages finish and starts fewer; raising it, more."""
    running: set[int] = set()
    peak = 0
    release = {i: asyncio.Event() for i in range(12)}
    started = asyncio.Condition()

    async def process(m: Message) -> None:
        nonlocal peak
        async with started:
            running.add(m.offset)
            peak = max(peak, len(running))
            started.notify_all()
        await release[m.offset].wait()
        async with started:
            running.discard(m.offset)
            started.notify_all()

    lanes = KeyLanes(process, max_concurrency=6)
    lanes.limit = 2
    lanes.start()
    for i in range(12):
        lanes.submit(_msg(i), ordered=True)
    async with started:
        await asyncio.wait_for(started.wait_for(lambda: len(running) == 2), 10)
    for _ in range(5):
        await asyncio.sleep(0)
    assert running == {0, 1}
    lanes.limit = 5
    async with started:
        await asyncio.wait_for(started.wait_for(lambda: len(running) == 5), 10)
    lanes.limit = 1
    for i in sorted(running):
        release[i].set()
    async with started:
        await asyncio.wait_for(started.wait_for(lambda: len(running) == 1), 10)
    assert peak == 5
    assert lanes.limit == 1
    lanes.limit = 100
    assert lanes.limit == 6  # never above max_concurrency
    for event in release.values():
        event.set()
    await asyncio.wait_for(lanes.wait_idle(), 10)
    await lanes.close()
