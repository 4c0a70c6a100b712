"""A permit: the right to run one job, holding a slot on each of its throttle keys."""

from __future__ import annotations

import os
import socket
import uuid
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Permit:
    """The right to run one job: a slot on each of ``keys`` until released or its lease lapses."""

    holder: str
    keys: tuple[str, ...]
    priority: int
    lease_ms: int
    unconditional: bool = False
    """Granted without Redis (fail open): releasing it does nothing."""


def default_member_id() -> str:
    """A member id unique to this process: host, pid and a random suffix."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
