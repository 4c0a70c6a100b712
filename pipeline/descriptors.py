"""A process's open-file limit: the soft limit raised to the hard one when a command starts.

Linux starts most services with a soft ``RLIMIT_NOFILE`` of 1024 (systemd's default, and many
container runtimes') under a much higher hard limit (systemd: 524288). The soft limit is kept
low for programs that wait with ``select(2)``, which cannot watch a descriptor above 1023;
systemd's documentation (``LimitNOFILE=`` in systemd.exec) asks programs that need more and do
not use it to raise their soft limit to the hard one themselves, as Go's runtime does for every
program. Nothing the commands run waits with ``select(2)`` on a descriptor that can pass 1023:
asyncio and uvloop use epoll, psycopg's wait functions, redis-py (hiredis), httpcore, the
standard library's ``subprocess``, ``socketserver`` and ``multiprocessing`` use poll, librdkafka
uses poll, and the span exporter selects on its standard input only (descriptor 0).

:func:`raise_open_file_limit` runs once at the start of every command, after logging is
configured (:func:`pipeline.startup.start`, for ``pipeline``'s entry point and the stand-alone
ones of the ingress and the registry), so a long-running one (:data:`LONG_RUNNING`:
``pipeline ingress serve`` and its workers, ``pipeline consume``, ``pipeline sweep --loop``,
``pipeline registry serve``) holds as many connections as its hard limit allows; the processes
it starts inherit the raised limit. It never lowers a limit. A refusal (a sandbox that forbids
``setrlimit``) is one warning line from a long-running command, which runs on under the limit it
was given; a short command (``--help``, ``topics list``, ``sweep`` once) opens a handful of
descriptors and says nothing (DEBUG).
"""

from __future__ import annotations

import logging
import resource
from collections.abc import Sequence

log = logging.getLogger(__name__)

__all__ = ["LONG_RUNNING", "UNLIMITED_SOFT", "long_running", "raise_open_file_limit"]

UNLIMITED_SOFT = 1 << 20
"""The soft limit taken when the hard limit is unlimited: Linux's default ``fs.nr_open``."""


LONG_RUNNING: tuple[tuple[str, ...], ...] = (
    ("ingress", "serve"),
    ("registry", "serve"),
    ("consume",),
    ("sweep", "--loop"),
)
"""The commands that run until stopped: their command words, then an option they need."""


def long_running(argv: Sequence[str]) -> tuple[str, ...] | None:
    """The :data:`LONG_RUNNING` entry ``argv`` (a command line less the program) runs, if any.

    ``--help`` anywhere runs nothing long.
    """
    if "--help" in argv:
        return None
    words = [arg for arg in argv if not arg.startswith("-")]
    for command in LONG_RUNNING:
        names = [part for part in command if not part.startswith("-")]
        options = [part for part in command if part.startswith("-")]
        if words[: len(names)] == names and all(option in argv for option in options):
            return command
    return None


def raise_open_file_limit(argv: Sequence[str]) -> int:
    """Raise the soft open-file limit to the hard one (never lower it); the soft limit now.

    ``argv`` is the command line less the program (``sys.argv[1:]``). An unlimited hard limit
    raises the soft one to :data:`UNLIMITED_SOFT`; an unlimited soft limit is left alone. When
    the system refuses, the limit stays, and a long-running command (:func:`long_running`) logs
    one warning line; any other command logs it at DEBUG.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = UNLIMITED_SOFT if hard == resource.RLIM_INFINITY else hard
    if soft == resource.RLIM_INFINITY or soft >= wanted:
        return soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    except (OSError, ValueError) as exc:
        command = long_running(argv)
        log.log(
            logging.DEBUG if command is None else logging.WARNING,
            "%s",
            _refused_line(command, soft, hard, exc),
        )
        return soft
    log.debug("open-file limit: soft limit raised from %d to %d", soft, wanted)
    return wanted


def _refused_line(
    command: tuple[str, ...] | None, soft: int, hard: int, exc: OSError | ValueError
) -> str:
    """The one line that says the raise was refused, and what the command runs with."""
    who = f"pipeline {' '.join(command)}" if command is not None else "this command"
    bound = ", and its default connection bound follows it" if command == LONG_RUNNING[0] else ""
    limit = "unlimited" if hard == resource.RLIM_INFINITY else str(hard)
    return (
        f"open-file limit: could not raise the soft limit from {soft} to the hard limit {limit}"
        f" ({_reason(exc)}); {who} runs with {soft} descriptors{bound}: raise the soft limit"
        " before the start (ulimit -n, LimitNOFILE=) for more"
    )


def _reason(exc: OSError | ValueError) -> str:
    """Why ``setrlimit`` refused (Python reports EPERM and EINVAL as ValueError, in its words)."""
    if isinstance(exc, OSError):
        return exc.strerror or str(exc)
    if "not allowed" in str(exc):  # EPERM ("not allowed to raise maximum limit")
        return "EPERM: this system does not permit it"
    return f"refused: {exc}"
