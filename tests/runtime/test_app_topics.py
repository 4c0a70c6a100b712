"""An App's lanes come from the directory every command reads (``PIPELINE_TOPICS_DIR``)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from pipeline.errors import ConfigError
from pipeline.runtime import App, Context


def test_an_app_reads_the_lanes_of_the_topics_directory_every_command_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``App()`` reads ``PIPELINE_TOPICS_DIR``, whatever the working directory.

    Before, ``App()`` read ``./topics`` while ``pipeline topics apply`` read the variable: a
    member started elsewhere than the declarations' parent found no lane, or other ones. The
    other settings are not read, so a bad one is left to the command that needs it.
    """
    declared = tmp_path / "declared"
    declared.mkdir()
    (declared / "up.yaml").write_text(yaml.safe_dump({"name": "up", "partitions": 1}))
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "topics").mkdir(parents=True)
    (elsewhere / "topics" / "other.yaml").write_text(
        yaml.safe_dump({"name": "other", "partitions": 1})
    )
    monkeypatch.chdir(elsewhere)
    monkeypatch.setenv("PIPELINE_TOPICS_DIR", str(declared))
    monkeypatch.setenv("PIPELINE_KAFKA__CLIENT", "not json")
    app = App()

    @app.handler("up")
    async def handle(event: bytes, ctx: Context) -> None:
        """Registered on the declared lane."""

    assert list(app.lanes) == ["up"]
    monkeypatch.delenv("PIPELINE_TOPICS_DIR")
    default = App()  # ./topics
    with pytest.raises(ConfigError, match="no lane 'up'"):
        default.handler("up")
