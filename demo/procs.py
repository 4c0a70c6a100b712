"""The demo's child processes: each in its own process group, stopped as a group.

Every child starts in a new session (``start_new_session=True``), so a Ctrl-C in the terminal
reaches only the orchestrator, which then stops the children in order: SIGTERM to the whole
group (the pipeline commands shut down gracefully on it), SIGKILL to whatever is left after the
grace period. Output goes to a log file per process, except for lines the orchestrator reads.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
from collections.abc import Mapping, Sequence
from pathlib import Path

from pipeline.errors import PipelineError

_URL = re.compile(rb"listening on (http://\S+)")


class ProcessFailed(PipelineError):
    """A child process exited early or did not become ready in time."""


class ManagedProcess:
    """One child process group: started, awaited until ready, stopped."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        log_dir: Path,
        cwd: Path,
        pipe_stdout: bool = False,
    ) -> None:
        """Describe the child; :meth:`start` runs it.

        Args:
            name: a short label (also the log file's stem).
            argv: the command.
            env: its whole environment.
            log_dir: where ``<name>.log`` gets its stderr (and stdout unless piped).
            cwd: its working directory.
            pipe_stdout: keep stdout readable through :meth:`lines` instead of logging it.
        """
        self.name = name
        self.argv = list(argv)
        self.log_path = log_dir / f"{name}.log"
        self._env = dict(env)
        self._cwd = cwd
        self._pipe = pipe_stdout
        self.proc: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        """Start the child in a new session (its own process group)."""
        log = self.log_path.open("ab")
        try:
            self.proc = await asyncio.create_subprocess_exec(
                *self.argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE if self._pipe else log,
                stderr=log,
                env=self._env,
                cwd=self._cwd,
                start_new_session=True,
            )
        finally:
            log.close()

    async def wait_url(self, timeout_s: float) -> str:
        """Read stdout (logging it) until the child prints ``listening on http://...``."""
        proc = self._running()
        if proc.stdout is None:
            raise ProcessFailed(f"{self.name}: stdout is not piped")
        try:
            async with asyncio.timeout(timeout_s):
                while True:
                    line = await proc.stdout.readline()
                    if not line:
                        raise ProcessFailed(f"{self.name} exited early; see {self.log_path}")
                    self._log(line)
                    found = _URL.search(line)
                    if found:
                        return found[1].decode()
        except TimeoutError:
            raise ProcessFailed(
                f"{self.name} not ready after {timeout_s:.0f}s; see {self.log_path}"
            ) from None

    async def drain_stdout(self) -> None:
        """Keep copying stdout to the log file (so the child never blocks on a full pipe)."""
        proc = self._running()
        if proc.stdout is None:
            return
        while line := await proc.stdout.readline():
            self._log(line)

    async def readline(self) -> bytes:
        """The next stdout line (empty at end of output)."""
        proc = self._running()
        return await proc.stdout.readline() if proc.stdout is not None else b""

    @property
    def returncode(self) -> int | None:
        """The exit status, or None while running."""
        return self.proc.returncode if self.proc is not None else None

    async def stop(self, grace_s: float) -> int | None:
        """SIGTERM the process group, SIGKILL it after ``grace_s``; return the exit status."""
        proc = self.proc
        if proc is None:
            return None
        if proc.returncode is None:
            self._signal_group(proc.pid, signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), grace_s)
            except TimeoutError:
                self._signal_group(proc.pid, signal.SIGKILL)
                await proc.wait()
        # Children the leader left behind in its group go too.
        self._signal_group(proc.pid, signal.SIGKILL)
        return proc.returncode

    def _running(self) -> asyncio.subprocess.Process:
        if self.proc is None:
            raise ProcessFailed(f"{self.name} was not started")
        return self.proc

    def _log(self, line: bytes) -> None:
        with self.log_path.open("ab") as log:
            log.write(line)

    @staticmethod
    def _signal_group(pgid: int, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)


async def run_once(argv: Sequence[str], *, env: Mapping[str, str], cwd: Path) -> str:
    """Run a short command to completion; :class:`ProcessFailed` with its output if it fails."""
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env=dict(env),
        cwd=cwd,
    )
    output, _ = await proc.communicate()
    text = output.decode(errors="replace")
    if proc.returncode != 0:
        raise ProcessFailed(f"{' '.join(argv)} failed ({proc.returncode}):\n{text}")
    return text
