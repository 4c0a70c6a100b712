"""``pipeline.cli.flags`` on a typer without ``TyperOption.display_type_rich`` (before 0.29).

It read the attribute at import, so every ``pipeline`` command died there on such a typer
(``AttributeError: type object 'TyperOption' has no attribute 'display_type_rich'``, seen on
typer 0.19 to 0.28, which pyproject allows). Without the attribute nothing is patched.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from types import ModuleType
from typing import Annotated

import pytest
import typer
from typer import core
from typer.testing import CliRunner

import pipeline.cli.flags


@pytest.fixture
def flags_without_the_attribute(monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    """The flags module imported anew with the attribute gone from TyperOption and its bases.

    Afterwards typer's own method is put back and the module imported and applied again, as
    ``pipeline.cli`` left it.
    """
    typers_own = pipeline.cli.flags._typed
    for owner in core.TyperOption.__mro__:
        if "display_type_rich" in vars(owner):
            monkeypatch.delattr(owner, "display_type_rich")
    assert not hasattr(core.TyperOption, "display_type_rich")
    try:
        yield importlib.reload(pipeline.cli.flags)
    finally:
        monkeypatch.undo()
        core.TyperOption.display_type_rich = typers_own  # type: ignore[method-assign]
        importlib.reload(pipeline.cli.flags).show_flags_as_flags()


def test_the_module_imports_and_patches_nothing(flags_without_the_attribute: ModuleType) -> None:
    """Imported and called on such a typer: no error, and no method added to typer's class."""
    flags_without_the_attribute.show_flags_as_flags()
    assert not hasattr(core.TyperOption, "display_type_rich")


def test_help_renders_on_such_a_typer(flags_without_the_attribute: ModuleType) -> None:
    """Help of a command with a flag renders; older typer's help calls no such method.

    A typer whose help does call it (0.29) gets it back for the rendering: what is checked is
    that the module imported on the older one leaves help working, flag listed without a type.
    """
    flags_without_the_attribute.show_flags_as_flags()
    app = typer.Typer()

    @app.command()
    def main(
        json: Annotated[bool, typer.Option("--json", help="One JSON object.")] = False,
    ) -> None:
        """A command with a flag."""
        del json

    with pytest.MonkeyPatch.context() as restore:
        restore.setattr(
            core.TyperOption,
            "display_type_rich",
            lambda option, ctx: None,  # noqa: ARG005 - an older typer's help: no type shown
            raising=False,
        )
        result = CliRunner().invoke(app, ["--help"], env={"COLUMNS": "120"})
    assert result.exit_code == 0, result.output
    line = next(line for line in result.output.splitlines() if "--json" in line)
    assert "One JSON object." in line
    assert "<bool>" not in line


def test_the_flags_are_untyped_again_once_the_attribute_is_back() -> None:
    """On the typer installed (0.29 and later) the patch is in place: a flag has no type."""
    assert core.TyperOption.display_type_rich is pipeline.cli.flags._flag_untyped
