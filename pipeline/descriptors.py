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

:func:`raise_open_file_limit` runs once at the start of every command (``pipeline``'s entry
point, and the stand-alone ones of the ingress and the registry), so a long-running one
(``pipeline ingress serve`` and its workers, ``pipeline consume``, ``pipeline sweep --loop``,
``pipeline registry serve``) holds as many connections as its hard limit allows; the processes
it starts inherit the raised limit. It never lowers a limit, and a refusal (a sandbox that
forbids ``setrlimit``) is one warning line: the command runs on under the limit it was given.
"""

from __future__ import annotations

import logging
import resource

log = logging.getLogger(__name__)

__all__ = ["UNLIMITED_SOFT", "raise_open_file_limit"]

UNLIMITED_SOFT = 1 << 20
"""The soft limit taken when the hard limit is unlimited: Linux's default ``fs.nr_open``."""


def raise_open_file_limit() -> int:
    """Raise the soft open-file limit to the hard one (never lower it); the soft limit now.

    An unlimited hard limit raises the soft one to :data:`UNLIMITED_SOFT`; an unlimited soft
    limit is left alone. When the system refuses, one warning line, and the limit stays.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = UNLIMITED_SOFT if hard == resource.RLIM_INFINITY else hard
    if soft == resource.RLIM_INFINITY or soft >= wanted:
        return soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    except (OSError, ValueError) as exc:
        log.warning(
            "open-file limit: could not raise the soft limit from %d to the hard limit %s (%s);"
            " running with %d descriptors, and the ingress's default connection bound follows"
            " it: raise the soft limit before the start (ulimit -n, LimitNOFILE=) for more",
            soft,
            "unlimited" if hard == resource.RLIM_INFINITY else hard,
            _reason(exc),
            soft,
        )
        return soft
    log.debug("open-file limit: soft limit raised from %d to %d", soft, wanted)
    return wanted


def _reason(exc: OSError | ValueError) -> str:
    """Why ``setrlimit`` refused (Python reports EPERM and EINVAL as ValueError, in its words)."""
    if isinstance(exc, OSError):
        return exc.strerror or str(exc)
    if "not allowed" in str(exc):  # EPERM ("not allowed to raise maximum limit")
        return "EPERM: this system does not permit it"
    return f"refused: {exc}"
