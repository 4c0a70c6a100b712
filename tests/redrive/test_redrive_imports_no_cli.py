"""The redrive library prints its times without the command-line modules.

``pipeline.redrive.redrive`` imported ``pipeline.cli_support`` (and with it typer and rich) only
for ``utc_time``; a library importer (the operator's own script, a worker) paid for both.
"""

from __future__ import annotations

import subprocess
import sys

from pipeline.cli_support import utc_time as cli_utc_time
from pipeline.times import utc_time


def test_importing_redrive_loads_no_cli_module() -> None:
    """A fresh interpreter importing the redrive module has neither cli_support nor typer."""
    probe = (
        "import sys, pipeline.redrive.redrive\n"
        "print(sorted(m for m in ('pipeline.cli_support', 'typer', 'rich') if m in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    assert done.stdout.strip() == "[]", done.stderr


def test_the_commands_print_times_as_before() -> None:
    """cli_support's utc_time is the same function: one format everywhere."""
    assert cli_utc_time is utc_time
    assert utc_time(1_796_622_000_123) == "2026-12-07T05:40:00.123Z"
    assert utc_time(10**20) == f"at {10**20} ms"
