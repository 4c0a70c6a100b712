"""Group members that a contract test can kill -9: a process, or a task on the memory broker.

A real broker's member runs in its own process (``member_proc.py``) and is killed with SIGKILL.
The in-memory broker lives in the test's process, so its member runs as a task that is
cancelled without closing its consumer: like a killed process, it just stops polling, and the
broker drops it after the session timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Protocol

from contract.member_proc import run_member
from support import delete_group_after

from pipeline.transport.protocol import Transport

MEMBER = Path(__file__).with_name("member_proc.py")


class Victim(Protocol):
    """A member that reports what it consumed, line by line, until it is killed."""

    async def read(self) -> dict[str, object]:
        """The next report line."""
        ...

    async def kill(self) -> list[dict[str, object]]:
        """Kill it at once; returns the lines it reported that were not read yet."""
        ...

    def reap(self) -> None:
        """Make sure it is gone and its resources are released."""
        ...


class ProcessMember:
    """``member_proc.py`` in its own process."""

    def __init__(self, transport: Transport, group: str, topic: str, mode: str, **env: str) -> None:
        """Start the process."""
        self._proc = subprocess.Popen(
            [sys.executable, str(MEMBER), transport.name, group, topic, mode],
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, **env},
        )

    async def read(self) -> dict[str, object]:
        """The next JSON line of its stdout."""
        assert self._proc.stdout is not None
        line = await asyncio.wait_for(asyncio.to_thread(self._proc.stdout.readline), 90)
        assert line, f"member exited early with {self._proc.poll()}"
        return dict(json.loads(line))

    async def kill(self) -> list[dict[str, object]]:
        """SIGKILL, then the lines it printed before dying."""
        self._proc.send_signal(signal.SIGKILL)
        rest, _ = await asyncio.to_thread(self._proc.communicate)
        return [dict(json.loads(line)) for line in rest.splitlines()]

    def reap(self) -> None:
        """Kill -9 the member if it still runs, and close its pipe."""
        self._proc.send_signal(signal.SIGKILL)
        self._proc.wait()
        if self._proc.stdout:
            self._proc.stdout.close()


class TaskMember:
    """The same member loop as a task of this process, on the in-memory broker."""

    def __init__(self, transport: Transport, group: str, topic: str, mode: str, **env: str) -> None:
        """Start the task."""
        self._lines: asyncio.Queue[dict[str, object]] = asyncio.Queue()
        expect = int(env.get("EXPECT", "0"))
        self._task = asyncio.create_task(
            run_member(transport, group, topic, mode, expect, self._lines.put_nowait)
        )

    async def read(self) -> dict[str, object]:
        """The next reported line."""
        getter = asyncio.ensure_future(self._lines.get())
        done, _ = await asyncio.wait(
            {getter, self._task}, timeout=90, return_when="FIRST_COMPLETED"
        )
        if getter not in done:
            getter.cancel()
            raise AssertionError(f"member ended or was silent: {self._task}")
        return getter.result()

    async def kill(self) -> list[dict[str, object]]:
        """Cancel the task without closing its consumer; the lines it reported meanwhile."""
        self.reap()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        rest = []
        while not self._lines.empty():
            rest.append(self._lines.get_nowait())
        return rest

    def reap(self) -> None:
        """Cancel the task if it still runs."""
        self._task.cancel()


def start_member(transport: Transport, group: str, topic: str, mode: str, **env: str) -> Victim:
    """A killable member of ``group`` on ``transport`` (see the module docstring).

    The group is deleted when the test ends, once the killed member's session has expired.
    """
    if transport.name == "memory":
        return TaskMember(transport, group, topic, mode, **env)
    delete_group_after(transport, group, [topic])
    return ProcessMember(transport, group, topic, mode, **env)
