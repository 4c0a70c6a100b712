"""README: the commands that talk only to the members' Redis take no --transport, and say so."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from pipeline.cli import app

README = Path(__file__).resolve().parents[2] / "README.md"


@pytest.mark.parametrize(
    "command",
    [["cancel"], ["capacity"], ["throttle", "status"], ["throttle", "set-limit"]],
    ids=" ".join,
)
def test_a_redis_only_command_takes_no_transport(command: list[str]) -> None:
    """Its --help lists no --transport: it uses PIPELINE_REDIS__URL on either transport."""
    result = CliRunner().invoke(app, [*command, "--help"], env={"COLUMNS": "120"})
    assert result.exit_code == 0, result.output
    assert "--transport" not in result.output


def test_the_readme_says_which_commands_take_no_transport() -> None:
    """The README's line on --transport names cancel, capacity and throttle as Redis-only."""
    text = " ".join(README.read_text(encoding="utf-8").split())
    assert (
        "`pipeline cancel`, `capacity` and `throttle` talk only to the members' Redis"
        " (`PIPELINE_REDIS__URL`) on either transport and take none"
    ) in text
    assert "`make services-status`" in text
