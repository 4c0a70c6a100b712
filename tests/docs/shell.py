"""Runs a markdown page's ``sh`` blocks as a reader would, and checks the output they show.

A page's ``sh`` block holds commands, each optionally followed by ``# `` lines: what the command
prints, ``...`` standing for anything. ``text`` blocks whose lines start with ``... `` show what
a long-running process (the ingress, a consumer) prints meanwhile. :class:`Session` keeps one
shell environment across blocks (``export`` and ``. .venv/bin/activate`` carry over), runs
long-running commands in the background as the reader's other terminals, and stops them and
checks nothing is left running at the end.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.testing.ports import free_port

_FENCE = re.compile(r"^```(\w+)[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)
WAIT_S = 60.0
"""How long a background process may take to print a line the page shows."""


@dataclass
class Step:
    """One command of a block and the lines the page says it prints."""

    command: str
    expected: list[str] = field(default_factory=list)


@dataclass
class Block:
    """A fenced block: ``sh`` (steps to run) or ``text`` (lines a background process prints)."""

    kind: str
    steps: list[Step]
    shown: list[str]


def blocks(markdown: str) -> Iterator[Block]:
    """The page's ``sh`` and ``text`` blocks, in order."""
    for match in _FENCE.finditer(markdown):
        kind, body = match.group(1), match.group(2)
        lines = body.splitlines()
        if kind == "text":
            shown = [ln.removeprefix("... ") for ln in lines if ln.startswith("... ")]
            yield Block(kind, [], shown)
        elif kind == "sh":
            steps: list[Step] = []
            for line in lines:
                if line.startswith("# ") and steps:
                    steps[-1].expected.append(line[2:])
                elif line.strip() and not line.startswith("#"):
                    steps.append(Step(line))
            yield Block(kind, steps, [])


def pattern(shown: str) -> re.Pattern[str]:
    """A line as the page shows it, ``...`` matching anything."""
    return re.compile(".*".join(re.escape(part) for part in shown.strip().split("...")))


def missing(shown: list[str], output: str) -> list[str]:
    """The shown lines that no line of ``output`` matches."""
    lines = output.splitlines()
    return [s for s in shown if not any(pattern(s).search(line) for line in lines)]


class Background:
    """A long-running command, its output collected line by line."""

    def __init__(self, command: str, env: Mapping[str, str], cwd: Path) -> None:
        """Start ``command`` in bash (``exec``, so a signal reaches the program itself)."""
        self.command = command
        self.lines: list[str] = []
        self._changed = threading.Condition()
        self.process = subprocess.Popen(
            ["bash", "-c", f"exec {command}"],
            cwd=cwd,
            env=dict(env),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            with self._changed:
                self.lines.append(line.rstrip("\n"))
                self._changed.notify_all()
        with self._changed:
            self._changed.notify_all()

    @property
    def output(self) -> str:
        """Everything printed so far."""
        with self._changed:
            return "\n".join(self.lines)

    def wait_for(self, shown: list[str], timeout_s: float = WAIT_S) -> list[str]:
        """Wait until every shown line was printed; return those that were not in time."""
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while True:
                left = missing(shown, "\n".join(self.lines))
                remaining_s = deadline - time.monotonic()
                if not left or remaining_s <= 0 or not self._reader.is_alive():
                    return left
                self._changed.wait(remaining_s)

    def stop(self) -> int:
        """Ctrl-C, as the page says, and the exit code (killed if it does not stop in 30 s)."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._reader.join(5)
        if self.process.stdout is not None:
            self.process.stdout.close()
        return self.process.returncode


class Session:
    """One reader's shell session over a page: foreground commands and background terminals."""

    def __init__(
        self,
        cwd: Path,
        env: Mapping[str, str],
        *,
        background: Callable[[str], bool],
        skip: Callable[[str], str | None],
        rewrite: Callable[[str], str],
    ) -> None:
        """Run in ``cwd`` with ``env``.

        Args:
            cwd: the working directory (a copy of the repository's files the page uses).
            env: the starting environment.
            background: whether a command keeps running (the reader's other terminal).
            skip: why a command is not run here (None: run it).
            rewrite: maps a command or a shown line to this run (ports, addresses).
        """
        self.cwd = cwd
        self.env = dict(env)
        self._background = background
        self._skip = skip
        self._rewrite = rewrite
        self.running: list[Background] = []
        self.transcript: list[str] = []

    def run(self, block: Block) -> None:
        """Run a ``sh`` block's steps, or wait for a ``text`` block's lines; fail loudly."""
        if block.kind == "text":
            shown = [self._rewrite(s) for s in block.shown]
            outputs = "\n".join(bg.output for bg in self.running)
            left = missing(shown, outputs)
            for bg in self.running:
                left = bg.wait_for(left) if left else left
            if left:
                raise AssertionError(f"not printed: {left}\n--- background output:\n{outputs}")
            return
        for step in block.steps:
            self.step(step)

    def step(self, step: Step) -> None:
        """Run one command; a background one must print its shown lines before moving on."""
        command = self._rewrite(step.command)
        expected = [self._rewrite(line) for line in step.expected]
        reason = self._skip(command)
        if reason:
            self.transcript.append(f"$ {command}    [skipped: {reason}]")
            return
        self.transcript.append(f"$ {command}")
        if self._background(command):
            bg = Background(command, self.env, self.cwd)
            self.running.append(bg)
            left = bg.wait_for(expected)
            if left or bg.process.poll() is not None:
                raise AssertionError(f"{command!r}: not printed {left}\n{bg.output}")
            return
        env_file = self.cwd / ".session-env"
        script = f"set -eo pipefail\n{command}\nenv -0 > {env_file}\n"
        result = subprocess.run(
            ["bash", "-c", script],
            cwd=self.cwd,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        output = result.stdout + result.stderr
        self.transcript.append(output)
        if result.returncode != 0:
            raise AssertionError(f"{command!r} exited {result.returncode}:\n{output}")
        left = missing(expected, output)
        if left:
            raise AssertionError(f"{command!r} did not print {left}:\n{output}")
        pairs = env_file.read_text().split("\0")
        self.env = dict(p.split("=", 1) for p in pairs if "=" in p)
        env_file.unlink()

    def close(self) -> dict[str, int]:
        """Stop every background command; their exit codes by command."""
        return {bg.command: bg.stop() for bg in reversed(self.running)}


ROOT = Path(__file__).resolve().parents[2]
# `make setup` and `make services` are the suite's own preconditions (its venv and services);
# `make demo` has its own test (tests/demo) and `make test` is the suite itself.
SKIPPED = {
    "make setup": "the test runs in the project's venv",
    "make services": "the suite's services are already up",
    "make demo": "tests/demo runs the demo",
    "make test": "this is the suite",
}
LONG_RUNNING = ("pipeline ingress serve", "pipeline consume")


def workdir(tmp_path: Path) -> Path:
    """A checkout as far as the pages read it: declarations, consumers, examples, the venv."""
    for part in ("topics", "consumers", "deploy/local"):
        shutil.copytree(ROOT / part, tmp_path / part)
    venv = Path(sys.prefix)
    if (venv / "bin" / "activate").exists():
        (tmp_path / ".venv").symlink_to(venv)
    else:  # not run from a venv: an activate that puts this interpreter's scripts first
        (tmp_path / ".venv" / "bin").mkdir(parents=True)
        bindir = Path(sys.executable).parent
        (tmp_path / ".venv" / "bin" / "activate").write_text(f'export PATH="{bindir}:$PATH"\n')
    return tmp_path


def reader(tmp_path: Path, prefix: str, redis_url: str, *, kafka: str | None = None) -> Session:
    """A reader's session on Redis under key prefix ``prefix``, the ingress on a free port.

    The pages' ``127.0.0.1:8080`` and ``redis://127.0.0.1:6379/0`` are rewritten to this run's.
    With ``kafka`` (bootstrap servers) the reader has exported ``PIPELINE_TRANSPORT=kafka``, as
    the getting-started guide says to for Kafka: what the page shows as printed on Redis is then
    printed on Kafka, ``redis`` and its address becoming ``kafka`` and ``kafka``'s address.
    Redis still holds the consumer's guard and throttle keys under ``prefix``.
    """
    port = free_port()

    def rewrite(text: str) -> str:
        text = text.replace("127.0.0.1:8080", f"127.0.0.1:{port}")
        if kafka is None:
            return text.replace("redis://127.0.0.1:6379/0", redis_url)
        text = text.replace("redis://127.0.0.1:6379/0", kafka)
        return re.sub(r"\bredis\b", "kafka", text)

    def skip(command: str) -> str | None:
        return next((why for start, why in SKIPPED.items() if command.startswith(start)), None)

    env = {
        **os.environ,
        "PIPELINE_TRANSPORT": "redis" if kafka is None else "kafka",
        "PIPELINE_REDIS__URL": redis_url,
        "PIPELINE_REDIS__KEY_PREFIX": prefix,
        "PIPELINE_INGRESS__PORT": str(port),
    }
    if kafka is not None:
        env["PIPELINE_KAFKA__BOOTSTRAP_SERVERS"] = kafka
    env.pop("PIPELINE_LOG_LEVEL", None)
    return Session(
        workdir(tmp_path),
        env,
        background=lambda command: command.startswith(LONG_RUNNING),
        skip=skip,
        rewrite=rewrite,
    )
