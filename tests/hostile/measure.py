"""What the by-hand flood measurements (``flood_rss.py``, ``ingress_tenants_rss.py``) share."""

from __future__ import annotations

import sys

import psutil


def say(line: str) -> None:
    """Write one line of the figures to standard output, at once."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def rss_kib(pid: int) -> int:
    """The process's resident set (``VmRSS``), in KiB."""
    return int(psutil.Process(pid).memory_info().rss) // 1024
