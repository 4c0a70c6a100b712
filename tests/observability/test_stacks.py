"""SIGUSR1 makes a running process write every thread's and every asyncio task's stack."""

from __future__ import annotations

import asyncio
import io
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
from ingress.helpers import start_empty_ingress
from runtime.helpers import declare, lane_spec
from support import StackDumps, delete_group_after

from pipeline.observability import stacks
from pipeline.transport.protocol import Transport

END = stacks.END


async def _inner(event: asyncio.Event) -> None:
    await event.wait()


async def _outer(event: asyncio.Event) -> None:
    await _inner(event)


async def test_the_dump_names_each_task_and_the_coroutines_it_waits_in(tmp_path: Path) -> None:
    """Each task by name, the chain of coroutines it is suspended in, and its future."""
    event = asyncio.Event()
    task = asyncio.create_task(_outer(event), name="lane-worker-7")
    await asyncio.sleep(0)  # the task runs to its first suspension
    with (tmp_path / "stacks.txt").open("w+") as out:  # faulthandler writes to a file descriptor
        stacks.dump(out)
        out.seek(0)
        text = out.read()
    event.set()
    await task
    assert f"stacks of process {os.getpid()}: threads" in text
    assert "in test_the_dump_names_each_task" in text  # the current thread, by faulthandler
    section = text.split("task lane-worker-7:\n", 1)[1].split("task ", 1)[0]
    frames = [line.strip() for line in section.splitlines()]
    assert [frame.rsplit(" in ", 1)[-1] for frame in frames[:3]] == ["_outer", "_inner", "wait"]
    assert frames[3].startswith("waits on <Future pending")
    assert text.endswith(END + "\n")


async def test_a_stream_without_a_descriptor_gets_the_threads_and_the_tasks() -> None:
    """The threads' stacks go through a scratch file, so any stream gets the whole dump."""
    out = io.StringIO()
    stacks.dump(out)
    text = out.getvalue()
    assert text.startswith(f"--- stacks of process {os.getpid()}: threads ---\n")
    assert "in test_a_stream_without_a_descriptor_gets_the_threads_and_the_tasks" in text
    assert "task " in text  # this test's own task
    assert text.endswith(END + "\n")


DUMPER = """
import asyncio, sys, threading
from pipeline.observability import stacks
async def main():
    release = threading.Event()
    threads = [threading.Thread(target=release.wait) for _ in range(8)]  # more to write
    for thread in threads:
        thread.start()
    idle = asyncio.Event()
    tasks = [asyncio.create_task(idle.wait(), name=f"idle-{n}") for n in range(50)]
    await asyncio.sleep(0)
    sys.stdin.read(1)  # every process is ready: they dump at the same time
    for _ in range(int(sys.argv[1])):
        stacks.dump()
    release.set()
    idle.set()
    await asyncio.gather(*tasks)
asyncio.run(main())
"""


def test_processes_sharing_one_stderr_write_their_dumps_whole() -> None:
    """Four processes dumping at once onto one pipe: every dump arrives in one piece."""
    processes, count = 4, 25
    read_end, write_end = os.pipe()
    try:
        children = [
            subprocess.Popen(
                [sys.executable, "-c", DUMPER, str(count)],
                stdin=subprocess.PIPE,
                stderr=write_end,
                close_fds=True,
            )
            for _ in range(processes)
        ]
        os.close(write_end)
        write_end = -1
        for child in children:
            assert child.stdin is not None
            child.stdin.close()  # the end of input: each begins
        with os.fdopen(read_end, "rb") as reader:
            read_end = -1
            text = reader.read().decode()
        assert [child.wait(60) for child in children] == [0] * processes
    finally:
        for fd in (read_end, write_end):
            if fd >= 0:
                os.close(fd)
    dumps = StackDumps()
    for line in text.splitlines():
        dumps.read(line)
    assert dumps.between
    assert sorted(dumps.whole.values()) == [count] * processes
    assert set(dumps.whole) == {child.pid for child in children}


async def test_sigusr1_to_pipeline_consume_dumps_its_tasks_and_it_goes_on(
    transport: Transport, unique: str
) -> None:
    """A running member answers SIGUSR1 with its stacks on stderr, then stops on SIGTERM."""
    spec = lane_spec(f"stacks_{unique}", 1, retry={"tiers": ["200ms"]})
    await declare(transport, spec)
    delete_group_after(transport, f"g-{unique}", spec.topic_names())
    env = {
        **os.environ,
        "POISON_TOPIC": spec.name,
        "POISON_DONE": f"done-{unique}",
        "PIPELINE_LOG_LEVEL": "INFO",
    }
    proc = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "pipeline", "consume", "runtime.poison_app:app"),
        *("--group", f"g-{unique}", "-t", transport.name),
        cwd=str(Path(__file__).parents[1]),
        env=env,
        stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stderr is not None
    try:
        seen = []
        while not any(f"g-{unique}" in line for line in seen):  # its start line: it joined
            line = (await asyncio.wait_for(proc.stderr.readline(), 60)).decode()
            assert line, f"pipeline consume exited before joining: {''.join(seen)}"
            seen.append(line)
        proc.send_signal(signal.SIGUSR1)
        dump = []
        while not dump or dump[-1].rstrip("\n") != END:
            line = (await asyncio.wait_for(proc.stderr.readline(), 60)).decode()
            assert line, f"pipeline consume exited instead of dumping: {''.join(dump)}"
            dump.append(line)
        text = "".join(dump)
        assert "task lane-worker-0:" in text
        assert "pipeline/runtime/member.py" in text  # the member's loop, polling
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 60) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


def test_sigusr1_to_the_ingress_dumps_its_tasks_and_it_goes_on(
    redis_service: str, tmp_path: Path
) -> None:
    """The ingress answers SIGUSR1 with its stacks on stderr and keeps serving."""
    proc = start_empty_ingress(tmp_path, redis_service)
    try:
        assert proc.stdout is not None
        assert proc.stderr is not None
        line = proc.stdout.readline()
        assert "ingress listening on" in line, line
        proc.send_signal(signal.SIGUSR1)
        dump = []
        while not dump or dump[-1].rstrip("\n") != END:
            read = proc.stderr.readline()
            assert read, f"the ingress exited instead of dumping: {''.join(dump)}"
            dump.append(read)
        text = "".join(dump)
        assert "asyncio tasks ---" in text
        assert "pipeline/ingress/service.py" in text  # its serving task, suspended
        webhook = line.split()[-1]
        with httpx.Client(timeout=10) as client:  # still serving
            assert client.get(f"{webhook}/hooks/none").status_code == 404
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
    assert proc.returncode in {0, -signal.SIGTERM}  # uvicorn re-raises the SIGTERM it handled


def test_remove_gives_sigusr1_its_default_action_back() -> None:
    """Installed, the loop answers SIGUSR1; removed, the signal ends a process again."""
    loop = asyncio.new_event_loop()
    try:
        stacks.install(loop)
        assert signal.getsignal(signal.SIGUSR1) is not signal.SIG_DFL
        stacks.remove(loop)
        assert signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL
    finally:
        loop.close()
