"""A stopping ingress ends by its stop bound even when something in the process holds its exit."""

from __future__ import annotations

import subprocess
import sys

HELD = """
import threading, time
from pipeline.ingress.exit_bound import exit_by

threading.Thread(target=threading.Event().wait, name="stuck-call").start()  # never ends
exit_by(time.monotonic() + 0.2, "PIPELINE_INGRESS__STOP_WITHIN_S")
print("stopped", flush=True)
"""

FREE = """
import time
from pipeline.ingress.exit_bound import exit_by

exit_by(time.monotonic() + 30, "PIPELINE_INGRESS__STOP_WITHIN_S")
print("stopped", flush=True)
"""


def test_a_process_held_past_its_bound_exits_with_one_line_naming_what_held_it() -> None:
    """A thread that never ends cannot keep the process past the bound: exit 1, one line."""
    done = subprocess.run(
        [sys.executable, "-c", HELD], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.stdout == "stopped\n"
    assert done.returncode == 1, done.stderr
    (line,) = done.stderr.splitlines()
    assert "PIPELINE_INGRESS__STOP_WITHIN_S" in line, line
    assert "stuck-call" in line, line


def test_a_process_that_ends_in_time_exits_as_it_would() -> None:
    """An armed bound neither delays nor changes a process that ends before it."""
    done = subprocess.run(
        [sys.executable, "-c", FREE], capture_output=True, text=True, timeout=20, check=False
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, "stopped\n", "")
