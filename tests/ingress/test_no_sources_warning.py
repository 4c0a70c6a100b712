"""An ingress whose sources file declares no source says so once it has started."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from ingress.helpers import started_and_stopped

pytestmark = pytest.mark.usefixtures("redis_service")


async def _started_with(tmp_path: Path, sources: dict[str, object]) -> None:
    await started_and_stopped(tmp_path, {"name": "t", "partitions": 1, "lane": "plain"}, sources)


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
