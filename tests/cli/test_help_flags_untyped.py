"""Every command's ``--help`` shows a flag as a flag: ``--json``, never ``--json <bool>``."""

from __future__ import annotations

from typing import Any

import typer
from typer._click import Context
from typer.testing import CliRunner

from pipeline.cli import app


def _paths(group: Any, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every command path under ``group`` (``("topics", "list")``), groups included.

    Typer's groups are click commands with ``list_commands`` (not ``click.Group``s).
    """
    paths = [prefix]
    ctx = Context(group)
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        if hasattr(command, "list_commands"):
            paths += _paths(command, (*prefix, name))
        elif command is not None:
            paths.append((*prefix, name))
    return paths


def test_no_help_shows_a_flag_as_taking_a_value() -> None:
    """``pipeline ... --help`` of every command: flags listed, no ``<bool>`` after any."""
    root = typer.main.get_command(app)
    runner = CliRunner()
    paths = _paths(root)
    assert ("topics", "list") in paths
    typed = {}
    for path in paths:
        result = runner.invoke(app, [*path, "--help"], env={"COLUMNS": "120"})
        assert result.exit_code == 0, (path, result.output)
        assert "--help" in result.output
        if "<bool>" in result.output:
            typed[" ".join(path) or "pipeline"] = [
                line.strip() for line in result.output.splitlines() if "<bool>" in line
            ]
    assert not typed, typed


def test_a_flag_still_takes_no_value() -> None:
    """``topics list --json`` is a flag: the help names it, with its text and no type."""
    result = CliRunner().invoke(app, ["topics", "list", "--help"], env={"COLUMNS": "120"})
    line = next(line for line in result.output.splitlines() if "--json" in line)
    assert "One JSON object per topic." in line
    assert "<" not in line
