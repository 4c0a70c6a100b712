"""`pipeline consume MODULE:APP` that names no App: one line saying what to type instead."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from support import run_pipeline

ROOT = Path(__file__).resolve().parents[2]
DOWN = {
    "PIPELINE_REDIS__URL": "redis://127.0.0.1:1/0",
    "PIPELINE_TOPICS_DIR": str(ROOT / "topics"),
}
"""Redis on a closed port (the target is checked before it is reached) and the declarations."""


def consume_error(target: str) -> str:
    """The one stderr line of ``pipeline consume TARGET`` run from the project root (exit 2)."""
    result = run_pipeline(
        "consume", target, "-g", "g", "-t", "redis", env={**os.environ, **DOWN}, cwd=ROOT
    )
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: "), lines[0]
    return lines[0]


def test_a_misspelt_app_names_the_apps_the_module_has() -> None:
    """An attribute the module lacks is said so, with the module's Apps to pick from."""
    line = consume_error("consumers.messages:ap")
    assert "'consumers.messages' has no attribute 'ap'" in line
    assert "consumers.messages:app" in line
    assert "NoneType" not in line


def test_an_attribute_that_is_no_app_names_the_apps_the_module_has() -> None:
    """An attribute that exists but is no App says what it is and which App to name instead."""
    line = consume_error("consumers.messages:log")
    assert "'consumers.messages:log' is not a pipeline App (got Logger)" in line
    assert "consumers.messages:app" in line


@pytest.mark.parametrize(
    "target",
    ["consumers/messages.py:app", "./consumers/messages.py:app", "consumers.messages.py:app"],
)
def test_a_file_path_is_answered_with_the_dotted_module(target: str) -> None:
    """A file path where the dotted module belongs suggests the dotted form to type."""
    line = consume_error(target)
    assert "dotted module" in line
    assert "`consumers.messages:app`" in line
    assert "No module named" not in line


def test_an_app_without_handlers_is_refused_instead_of_idling(tmp_path: Path) -> None:
    """An App with no handler would join no lane and idle for ever: one line says why it stops."""
    (tmp_path / "nohandlers.py").write_text("from pipeline.runtime import App\n\napp = App()\n")
    result = run_pipeline(
        "consume", "nohandlers:app", "-g", "g", "-t", "redis",
        env={**os.environ, **DOWN}, cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error: nohandlers:app has no handler: nothing to consume"), line
    assert '@app.handler("<lane>")' in line
