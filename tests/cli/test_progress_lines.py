"""Long commands show progress on a terminal as a bar, and elsewhere as a line now and then."""

from __future__ import annotations

import io

from rich.console import Console

from pipeline.cli_progress import progress


class _Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_without_a_terminal_a_line_comes_every_interval() -> None:
    """A CronJob's log (no terminal) gets a count every ``every_s``, not a bar it cannot draw."""
    out = io.StringIO()
    console = Console(file=out, force_terminal=False, width=200)
    clock = _Clock()
    with progress("redriving dlq", 1000, console=console, every_s=10.0, clock=clock) as advance:
        advance(100)
        clock.now = 9.9
        advance(200)
        assert out.getvalue() == ""  # not yet an interval
        clock.now = 10.0
        advance(300)
        clock.now = 15.0
        advance(100)
        clock.now = 20.5
        advance(0)
    assert out.getvalue().splitlines() == [
        "redriving dlq: 600 of 1,000 (60 %)",
        "redriving dlq: 700 of 1,000 (70 %)",
    ]


def test_on_a_terminal_it_is_a_bar_and_no_lines() -> None:
    """A terminal gets rich's bar, which it clears at the end: no count lines are left."""
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=200)
    clock = _Clock()
    with progress("replay", 10, console=console, every_s=10.0, clock=clock) as advance:
        clock.now = 60.0
        advance(10)
    assert "replay: 10 of 10" not in out.getvalue()


def test_disabled_it_shows_nothing() -> None:
    """A dry run, or nothing to do: no bar and no line."""
    out = io.StringIO()
    console = Console(file=out, force_terminal=False, width=200)
    clock = _Clock()
    with progress("replay", 10, console=console, disable=True, clock=clock) as advance:
        clock.now = 60.0
        advance(10)
    assert out.getvalue() == ""
