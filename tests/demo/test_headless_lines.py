"""A headless demo's lines stay whole in a log: never folded at the console's 80 columns."""

from __future__ import annotations

from pathlib import Path

import pytest

from demo.run import Demo, DemoOptions
from demo.stats import Collector
from demo.summary import Snapshot


def test_a_headless_progress_line_is_one_line_however_long(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A progress line past 80 columns reaches a pipe or a CI log as one line, not two halves."""
    monkeypatch.setenv("COLUMNS", "80")  # what rich assumes when stdout is no terminal
    demo = Demo(DemoOptions(output=tmp_path, headless=True))
    snapshot = Snapshot(
        "redis", 21.5, 20.0, "traffic", {"accepted": 123456}, {}, 0, 0, 0, Collector(start_ms=0)
    )
    demo._progress(snapshot)
    out = capsys.readouterr().out
    assert len(out.splitlines()) == 1, out
    assert len(out.strip()) > 80  # the case that used to fold
