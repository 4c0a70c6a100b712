"""A group member's stable identity: the name a restarted member comes back under.

Kafka calls it ``group.instance.id`` (static membership), Redis Streams the member name. A
member that restarts under the same name takes its own partitions back without moving anyone
else's; a fresh random name on every start (the old default) made every crash a group-wide
rebalance.

The name is ``--instance`` when given, else ``<pod or host name>-<slot>``: Kubernetes gives a
pod its name (``POD_NAME`` through the downward API, else ``HOSTNAME``), and the slot tells apart
members of one group that share a host. A slot is held with an advisory lock on a file in
``membership.slot_dir`` (default: under ``$XDG_RUNTIME_DIR`` or the temp directory), so the
kernel frees it when its process dies, even by ``kill -9``, and a replacement started
afterwards takes the same slot and so the same name. Two live processes
never share a slot: that would let two members claim one name, which Kafka answers by fencing
one of them and which would break per-key order on Redis Streams.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import socket
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from pipeline.errors import ConfigError

_MAX_SLOTS = 1_024
_UNSAFE = re.compile(r"[^A-Za-z0-9_.:-]")


@dataclass
class Identity:
    """A member name, and the slot lock that keeps it this process's while it lives."""

    name: str
    lock: IO[bytes] | None = None
    path: Path | None = None

    def release(self) -> None:
        """Give the slot up and remove its lock file (the process's exit frees the slot too).

        The file is removed while still locked; :func:`claim_identity` checks that the file it
        locked is still the one at the path, so a claim racing this removal tries again.
        """
        if self.lock is not None:
            if self.path is not None:
                with contextlib.suppress(FileNotFoundError):
                    self.path.unlink()
            self.lock.close()
            self.lock = None


def host_name() -> str:
    """The pod name (``POD_NAME``), else ``HOSTNAME``, else the machine's host name."""
    raw = os.environ.get("POD_NAME") or os.environ.get("HOSTNAME") or socket.gethostname()
    return _UNSAFE.sub("-", raw) or "member"


def lock_dir() -> Path:
    """The default home of slot locks: under ``$XDG_RUNTIME_DIR``, else the temp directory."""
    base = os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir()
    return Path(base) / "pipeline-members"


def claim_identity(
    group: str,
    instance: str | None = None,
    *,
    host: str | None = None,
    slot_dir: Path | None = None,
) -> Identity:
    """The stable name of this process's member of ``group``.

    Args:
        group: the consumer group (slots are counted per group).
        instance: an explicit name (``--instance``); used as it is, no slot is taken.
        host: the host part of a derived name (default :func:`host_name`).
        slot_dir: where slot locks live (default :func:`lock_dir`).

    Raises:
        ConfigError: the name has characters a member name cannot hold, or every slot is taken.
    """
    if instance is not None:
        if not instance or _UNSAFE.search(instance):
            raise ConfigError(f"--instance {instance!r}: use letters, digits and _ . : - only")
        return Identity(instance)
    prefix = host or host_name()
    directory = slot_dir or lock_dir()
    directory.mkdir(parents=True, exist_ok=True)
    safe_group = _UNSAFE.sub("-", group)
    for slot in range(_MAX_SLOTS):
        path = directory / f"{safe_group}.{prefix}.{slot}.lock"
        handle = _lock(path)
        if handle is not None:
            return Identity(f"{prefix}-{slot}", handle, path)
    raise ConfigError(
        f"every member slot of group {group!r} on {prefix} is taken ({_MAX_SLOTS} members);"
        " pass --instance NAME"
    )


def _lock(path: Path) -> IO[bytes] | None:
    """The locked file at ``path``, or None when another live process holds it."""
    while True:
        handle = path.open("ab")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            return None
        except OSError:
            handle.close()
            raise
        try:
            same = path.stat().st_ino == os.fstat(handle.fileno()).st_ino
        except FileNotFoundError:
            same = False
        if same:
            return handle
        handle.close()  # removed by a releasing holder after we opened it: take the new file
