"""The three command entry points start alike: logging from the environment, then the limit.

``pipeline``, ``python -m pipeline.registry`` and ``python -m pipeline.ingress.cli`` each
configure logging from ``PIPELINE_LOG_LEVEL`` and ``PIPELINE_LOG_FORMAT`` and then raise the
soft open-file limit (:mod:`pipeline.startup`). Each test starts the real entry: a variable
with a value it cannot take is one ``error:`` line naming it (exit 2 from ``pipeline``, as its
other configuration errors; exit 1 from the stand-alone entries, as they have always answered),
and the raise from 256 is logged in the configured format, at DEBUG, and nowhere above.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from cli.limits_sandbox import hard_limit_at_least, limited

PIPELINE = [str(Path(sys.executable).with_name("pipeline"))]
REGISTRY = [sys.executable, "-m", "pipeline.registry"]
INGRESS = [sys.executable, "-m", "pipeline.ingress.cli"]
ENTRIES = [(PIPELINE, 2), (REGISTRY, 2), (INGRESS, 2)]
"""Each entry, and its exit code for a log variable it cannot take (bad configuration: 2)."""
IDS = ["pipeline", "python -m pipeline.registry", "python -m pipeline.ingress.cli"]
SOFT, HARD = 256, 4096


def _run(argv: list[str], tmp_path: Path, **variables: str) -> subprocess.CompletedProcess[str]:
    """``argv --help`` under ``SOFT:HARD`` open files, without this process's ``PIPELINE_*``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIPELINE_")} | variables
    return subprocess.run(
        [*argv, "--help"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        preexec_fn=limited(SOFT, hard_limit_at_least(HARD)),
    )


@pytest.mark.parametrize(("argv", "code"), ENTRIES, ids=IDS)
@pytest.mark.parametrize(
    ("variable", "value", "line"),
    [
        (
            "PIPELINE_LOG_LEVEL",
            "verbose",
            (
                "error: PIPELINE_LOG_LEVEL='verbose' is not a log level:"
                " use DEBUG, INFO, WARNING, ERROR, CRITICAL"
            ),
        ),
        (
            "PIPELINE_LOG_FORMAT",
            "jsonl",
            "error: PIPELINE_LOG_FORMAT='jsonl' is not a log format: use text or json",
        ),
    ],
    ids=["level", "format"],
)
def test_a_log_variable_it_cannot_take_is_one_line_from_each_entry(
    argv: list[str], code: int, variable: str, value: str, line: str, tmp_path: Path
) -> None:
    """The same line from every entry, and nothing else: no usage, no traceback."""
    done = _run(argv, tmp_path, **{variable: value})
    assert (done.returncode, done.stderr, done.stdout) == (code, line + "\n", "")


@pytest.mark.parametrize("argv", [argv for argv, _ in ENTRIES], ids=IDS)
def test_each_entry_raises_the_limit_after_logging_is_configured(
    argv: list[str], tmp_path: Path
) -> None:
    """At DEBUG the raise is the first line, formatted; at the default level nothing is said."""
    quiet = _run(argv, tmp_path)
    assert (quiet.returncode, quiet.stderr) == (0, ""), quiet.stderr
    assert "Usage" in quiet.stdout
    debug = _run(argv, tmp_path, PIPELINE_LOG_LEVEL="debug")
    assert debug.returncode == 0, debug.stderr
    first = debug.stderr.splitlines()[0]
    assert re.fullmatch(
        r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} DEBUG pipeline\.descriptors"
        rf" open-file limit: soft limit raised from {SOFT} to {HARD}",
        first,
    ), debug.stderr
