"""Shared by the peer scripts: arguments, the clock and the one JSON result line.

Every peer times the same span: from the first message its handler receives to the last one it
handled (process start, imports and the group join are outside it), with the process CPU time
(``getrusage``, all threads) over that span. It then asks its framework for one final commit and
reports how long that took separately (``commit_s``). The result is one line on stdout starting
with ``RESULT `` followed by a JSON object; everything else goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from typing import Any


def parse_args(description: str) -> argparse.Namespace:
    """The arguments every peer takes."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--messages", type=int, required=True)
    parser.add_argument("--timeout", type=float, default=300.0, help="give up after this long")
    return parser.parse_args()


def cpu_s() -> float:
    """Process CPU seconds, every thread."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class Span:
    """First message received to last message handled, wall and CPU."""

    def __init__(self, expected: int) -> None:
        """Expect ``expected`` messages."""
        self.expected = expected
        self.count = 0
        self.t0 = self.t1 = 0.0
        self.cpu0 = self.cpu1 = 0.0

    def handled(self) -> bool:
        """Count one handled message; True when it was the last expected one."""
        if self.count == 0:
            self.t0 = time.perf_counter()
            self.cpu0 = cpu_s()
        self.count += 1
        if self.count == self.expected:
            self.t1 = time.perf_counter()
            self.cpu1 = cpu_s()
            return True
        return False

    def result(self, peer: str, **extra: Any) -> dict[str, Any]:
        """The measured span as the result object."""
        return {
            "peer": peer,
            "messages": self.count,
            "seconds": self.t1 - self.t0,
            "cpu_s": self.cpu1 - self.cpu0,
            **extra,
        }


def emit(result: dict[str, Any]) -> None:
    """Print the result line the harness reads."""
    out = sys.__stdout__ or sys.stdout  # faust's worker redirects sys.stdout into its logger
    out.write("RESULT " + json.dumps(result) + "\n")
    out.flush()
