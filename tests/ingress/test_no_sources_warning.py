"""An ingress whose sources file declares no source says so once it has started."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import yaml
from support import test_settings as settings_for

from pipeline.config import IngressSettings, SweeperSettings
from pipeline.ingress.service import build_ingress

pytestmark = pytest.mark.usefixtures("redis_service")


async def _started_with(tmp_path: Path, sources: dict[str, object]) -> None:
    topics = tmp_path / "topics"
    topics.mkdir()
    (topics / "t.yaml").write_text(
        yaml.safe_dump({"name": "t", "partitions": 1, "lane": "plain"}), encoding="utf-8"
    )
    path = tmp_path / "sources.yaml"
    path.write_text(yaml.safe_dump({"sources": sources}), encoding="utf-8")
    settings = settings_for(topics_dir=topics, transport="redis")
    ingress = IngressSettings(
        sources_file=path, sqlite_path=tmp_path / "i.db", sweeper=SweeperSettings(enabled=False)
    )
    built = build_ingress(settings, ingress)
    try:
        await built.start()
    finally:
        await built.stop()


async def test_no_source_is_one_warning_naming_the_file(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Every webhook would be answered 404: one warning line names the file and the fix."""
    with caplog.at_level(logging.WARNING, logger="pipeline.ingress.service"):
        await _started_with(tmp_path, {})
    (record,) = caplog.records
    assert str(tmp_path / "sources.yaml") in record.getMessage()
    assert "404" in record.getMessage()


async def test_a_declared_source_is_no_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A sources file with a source starts without a word."""
    with caplog.at_level(logging.WARNING, logger="pipeline.ingress.service"):
        await _started_with(tmp_path, {"plain": {"scheme": "none", "topic": "t"}})
    assert caplog.records == []
