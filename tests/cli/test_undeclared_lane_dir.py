"""A handler or cancel for an undeclared lane names the directory read, not always topics/."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.errors import ConfigError
from pipeline.runtime import App


def _declare(directory: Path, name: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{name}.yaml").write_text(f"name: {name}\npartitions: 1\n", encoding="utf-8")
    return directory


def test_handler_of_an_undeclared_lane_names_pipeline_topics_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PIPELINE_TOPICS_DIR names another directory: the line names it and the variable."""
    other = _declare(tmp_path / "elsewhere", "messages")
    monkeypatch.setenv("PIPELINE_TOPICS_DIR", str(other))
    app = App()
    with pytest.raises(ConfigError) as caught:
        app.handler("engagement")
    line = str(caught.value)
    assert line.startswith(f"no lane 'engagement' is declared in {other}/ (declared: messages);")
    assert "topics/" not in line.replace(f"{other}/", "")
    assert "PIPELINE_TOPICS_DIR" in line


async def test_cancel_of_an_undeclared_lane_names_the_directory_given(tmp_path: Path) -> None:
    """App(directory): the line names that directory (no Redis is asked for an unknown lane)."""
    given = _declare(tmp_path / "given", "messages")
    app = App(given)
    with pytest.raises(ConfigError) as caught:
        await app.cancel(None, key="k", lane="engagement")  # type: ignore[arg-type]
    assert str(caught.value) == (
        f"no lane 'engagement' is declared in {given}/ (declared: messages);"
        " declare it in a yaml file there"
    )
