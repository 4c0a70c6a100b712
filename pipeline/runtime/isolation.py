"""Suspects run alone: a member-wide gate that tells a poison message from its neighbours.

A message whose previous start never finished (its member died, or lost it mid-run) is a
*suspect*. When a member crashes, every message it was running is one, and only one of them may
be the cause. So a suspect runs alone: new runs wait while it does, and it starts only once
the runs in progress have finished. A crash during a lone run can only be the suspect's doing;
its neighbours, run alone in turn, finish and are not blamed (see ``pipeline/retry/lua/guard.lua``,
``gd_solo``, which counts lone starts towards ``poison_after``). The run guard keeps the gate
closed until the suspect's end is in Redis, so the next run cannot crash the member while that
end is still on its way.

A suspect that hangs would hold the whole member: after ``alone_for_s`` the gate opens again
for the others while it goes on running.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager


class Isolation:
    """Ordinary runs share the member; a suspect runs alone, one suspect at a time."""

    def __init__(self, alone_for_s: float) -> None:
        """Let a lone run hold the others back for at most ``alone_for_s`` seconds."""
        self._alone_for_s = alone_for_s
        self._running = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._open = asyncio.Event()
        self._open.set()
        self._turn = asyncio.Lock()
        self._suspects = 0
        self._waiting = 0

    @property
    def suspects(self) -> int:
        """Suspects waiting for their lone run or running it."""
        return self._suspects

    @property
    def waiting(self) -> int:
        """Ordinary runs waiting for the gate to open (:meth:`enter_shared`)."""
        return self._waiting

    @asynccontextmanager
    async def shared(self) -> AsyncIterator[None]:
        """An ordinary run: waits only while a suspect is due."""
        await self.enter_shared()
        try:
            yield
        finally:
            self.leave_shared()

    async def enter_shared(self) -> None:
        """Start an ordinary run (waits only while a suspect is due); end it with leave_shared."""
        self._waiting += 1
        try:
            while not self._open.is_set():
                await self._open.wait()
        finally:
            self._waiting -= 1
        self._running += 1

    def try_enter_shared(self) -> bool:
        """Start an ordinary run now if no suspect is due (no await); False: use enter_shared."""
        if not self._open.is_set():
            return False
        self._running += 1
        return True

    def leave_shared(self) -> None:
        """An ordinary run started by :meth:`enter_shared` ended."""
        self._running -= 1
        if not self._running and self._suspects:  # only a suspect waits for the runs to end
            self._idle.set()

    @asynccontextmanager
    async def alone(self) -> AsyncIterator[None]:
        """A suspect's run: no new run starts, and it starts when those in progress ended."""
        self._suspects += 1
        self._open.clear()
        try:
            async with self._turn:
                while self._running:  # the last shared run to leave sets it
                    self._idle.clear()
                    await self._idle.wait()
                timer = asyncio.get_running_loop().call_later(self._alone_for_s, self._open.set)
                try:
                    yield
                finally:
                    timer.cancel()
        finally:
            self._suspects -= 1
            if not self._suspects:
                self._open.set()
