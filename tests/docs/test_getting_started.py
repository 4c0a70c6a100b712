"""docs/getting-started.md, run as written against real Redis: a signed webhook gets handled."""

from __future__ import annotations

from pathlib import Path

import pytest
from redis.asyncio import Redis
from shell import ROOT, blocks, reader

from pipeline.config import Settings

GUIDE = ROOT / "docs" / "getting-started.md"


@pytest.mark.timeout(240)
async def test_the_guide_runs_as_written(
    tmp_path: Path, prefix: str, redis: Redis, settings: Settings
) -> None:
    """Every sh block of the guide runs, prints what the guide shows, and stops cleanly."""
    session = reader(tmp_path, prefix, settings.redis.url)
    ran = 0
    try:
        for block in blocks(GUIDE.read_text(encoding="utf-8")):
            session.run(block)
            ran += len(block.steps) + len(block.shown)
    finally:
        codes = session.close()
    assert ran >= 15, "\n".join(session.transcript)
    assert [c.split()[:2] for c in codes] == [["pipeline", "consume"], ["pipeline", "ingress"]]
    for command, code in codes.items():
        assert code in {0, 130}, f"{command} exited {code} on Ctrl-C"  # 130: stopped by SIGINT
    for background in session.running:
        assert "Traceback" not in background.output, background.output
    consumer = session.running[1].output
    assert "dead letter on lane messages" in consumer
    assert await redis.exists(f"{prefix}:topics")
