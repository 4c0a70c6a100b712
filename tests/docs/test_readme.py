"""README.md's shell blocks, run as written against real Redis beside a running ingress."""

from __future__ import annotations

from pathlib import Path

import pytest
from redis.asyncio import Redis
from shell import ROOT, Step, blocks, reader

from pipeline.config import Settings

README = ROOT / "README.md"
# What the README assumes (docs/getting-started.md sets it up): the project's venv active, the
# example sources with their secrets, and an ingress for `pipeline send` and the /metrics line.
SECRETS = "GITHUB_WEBHOOK_SECRET=dev-secret META_APP_SECRET=dev-secret META_VERIFY_TOKEN=dev-token"
SETUP = [
    Step(". .venv/bin/activate"),
    Step("cp deploy/local/sources.example.yaml sources.yaml"),
    Step(f"export {SECRETS}"),
    Step("pipeline ingress serve", ["ingress listening on http://127.0.0.1:8080"]),
]


@pytest.mark.timeout(240)
async def test_the_readme_runs_as_written(
    tmp_path: Path, prefix: str, redis: Redis, settings: Settings
) -> None:
    """Every sh block of the README runs and prints what the README shows."""
    session = reader(tmp_path, prefix, settings.redis.url)
    commands = 0
    try:
        for step in SETUP:
            session.step(step)
        for block in blocks(README.read_text(encoding="utf-8")):
            session.run(block)
            commands += len(block.steps)
    finally:
        codes = session.close()
    transcript = "\n".join(session.transcript)
    assert commands >= 10, transcript
    skipped = [line for line in session.transcript if "[skipped: " in line]
    assert [line.split()[1:3] for line in skipped] == [["make", "demo"], ["make", "test"]]
    for command, code in codes.items():
        assert code in {0, 130}, f"{command} exited {code} on Ctrl-C"  # 130: stopped by SIGINT
    for background in session.running:
        assert "Traceback" not in background.output, background.output
