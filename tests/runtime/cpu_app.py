"""CPU-bound handlers for the process-pool test; they record results in a Redis set.

The set is named after the lane (``cpu-done:<lane>``): workers are forked from a
forkserver started once per test session, so they do not see environment set by a later test.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time

import redis

from pipeline.errors import DeadLetter
from pipeline.runtime import Context


def _record(lane: str, value: str) -> None:
    client = redis.Redis.from_url(os.environ.get("PIPELINE_REDIS__URL", "redis://127.0.0.1:6379/0"))
    try:
        client.sadd(f"cpu-done:{lane}", value)
    finally:
        client.close()


def crunch(event: bytes, ctx: Context) -> None:
    """Burn CPU in the worker, then record the result with the attempt number."""
    if event == b"hang" and ctx.attempt == 1:
        time.sleep(600)  # killed at the time limit long before this ends
    if event == b"crash" and ctx.attempt == 1:
        os._exit(9)  # the worker dies, as under the OOM killer
    total = sum(i * i for i in range(200_000))
    _record(ctx.lane, f"{event.decode()}:{ctx.attempt}:{total}")


def stall(event: bytes, ctx: Context) -> None:
    """On its first attempt freeze the worker (SIGSTOP: no more heartbeats); then record."""
    if ctx.attempt == 1:
        _record(ctx.lane, f"pid:{os.getpid()}")
        os.kill(os.getpid(), signal.SIGSTOP)
    _record(ctx.lane, f"{event.decode()}:{ctx.attempt}")


def hold(event: bytes, ctx: Context) -> None:
    """Keep the worker busy for the seconds after the event's ``:`` (none: 0), then record.

    ``long:5`` records ``long:began`` first, then sleeps 5 s, then records ``long:1``.
    """
    name, _, seconds = event.decode().partition(":")
    _record(ctx.lane, f"{name}:began")
    time.sleep(float(seconds or 0))  # the handler's work: the worker stays alive and beating
    _record(ctx.lane, f"{name}:{ctx.attempt}")


def spawn(event: bytes, ctx: Context) -> None:
    """Start a child process, record both pids, and wait for the child (until cancelled)."""
    child = subprocess.Popen(["sleep", "600"])
    _record(ctx.lane, f"pids:{os.getpid()}:{child.pid}")
    if child.wait() == 0:  # the child ran to its end: it was not stopped
        _record(ctx.lane, "finished")


def patient(event: bytes, ctx: Context) -> None:
    """Record the worker's pid, then work in steps until ctx.cancelled says to stop."""
    _record(ctx.lane, f"pid:{os.getpid()}")
    while not ctx.cancelled:
        time.sleep(0.05)
    _record(ctx.lane, "saw-cancel")


class Refused(DeadLetter):
    """A fatal error whose constructor takes two arguments, as many libraries' errors do."""

    def __init__(self, code: int, detail: str) -> None:
        """The HTTP-like ``code`` and what it says."""
        super().__init__(f"{code}: {detail}")
        self.code = code


class Unpicklable(RuntimeError):
    """A retryable error that holds a lock, which pickle cannot copy."""

    def __init__(self, message: str) -> None:
        """``message``, and a lock of its own."""
        super().__init__(message)
        self.lock = threading.Lock()


def refuse(event: bytes, ctx: Context) -> None:
    """Record the attempt; ``refuse`` raises a fatal error, ``lock`` an unpicklable one."""
    _record(ctx.lane, f"{event.decode()}:{ctx.attempt}")
    if event == b"refuse":
        raise Refused(422, "not a document")
    raise Unpicklable("the dependency held a lock")


def answer(event: bytes, ctx: Context) -> threading.Lock:
    """Do the work, record it, and return a value pickle cannot copy (the runtime ignores it)."""
    _record(ctx.lane, f"{event.decode()}:{ctx.attempt}")
    return threading.Lock()


def whoami(lane: str) -> None:
    """Record the worker's pid under ``lane`` (called through the pool directly)."""
    _record(lane, f"pid:{os.getpid()}")


def _send() -> None:
    """A side effect ``once`` would guard; never reached in a worker."""


def remember(event: bytes, ctx: Context) -> None:
    """Call ``ctx.once`` as a plain ``def`` can (without ``await``), then record the attempt."""
    ctx.once("send", _send)  # type: ignore[arg-type]
    _record(ctx.lane, f"{event.decode()}:{ctx.attempt}")
