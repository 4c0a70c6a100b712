"""A topic missing on the broker is to be declared in the directory read, not always in topics/.

``pipeline tail``, ``produce`` and ``consume`` of a topic the broker lacks said "declare it in
topics/ and run `pipeline topics apply`" whatever ``PIPELINE_TOPICS_DIR`` named: an operator
whose declarations live elsewhere was sent to a directory that is not read. Both transports.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

TRANSPORTS = ["redis", "kafka"]


def _declare(directory: Path, name: str) -> Path:
    """A topics directory declaring lane ``name``, never applied."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{name}.yaml").write_text(f"name: {name}\npartitions: 1\n", encoding="utf-8")
    return directory


def _pipeline(*args: str, topics: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run ``pipeline ARGS`` with ``PIPELINE_TOPICS_DIR`` naming ``topics``."""
    env = {**os.environ, "PIPELINE_TOPICS_DIR": str(topics), "PYTHONPATH": str(cwd)}
    return subprocess.run(
        [sys.executable, "-m", "pipeline", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=cwd,
        check=False,
    )


def _hint_of(result: subprocess.CompletedProcess[str], topics: Path) -> str:
    """The one line of stderr that says where to declare the topic."""
    assert result.returncode != 0, result.stdout + result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    (line,) = [ln for ln in result.stderr.splitlines() if "declare it in" in ln]
    assert f"declare it in {topics}/ and run `pipeline topics apply`" in line, line
    assert "declare it in topics/" not in line, line
    return line


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("command", ["tail", "produce"])
def test_tail_and_produce_name_pipeline_topics_dir(
    command: str, transport: str, tmp_path: Path, unique: str, request: pytest.FixtureRequest
) -> None:
    """The topic is missing on the broker: the line sends the operator to PIPELINE_TOPICS_DIR."""
    request.getfixturevalue(f"{transport}_service")
    name = f"hint_{unique}"
    topics = _declare(tmp_path / "declared" / "lanes", name)
    extra = ["--limit", "1"] if command == "tail" else ["--value", "{}"]
    line = _hint_of(
        _pipeline(command, name, "-t", transport, *extra, topics=topics, cwd=tmp_path), topics
    )
    assert name in line


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_consume_names_pipeline_topics_dir(
    transport: str, tmp_path: Path, unique: str, request: pytest.FixtureRequest
) -> None:
    """A member of a lane declared there but never applied: the line names that directory."""
    request.getfixturevalue(f"{transport}_service")
    name = f"hint_{unique}"
    topics = _declare(tmp_path / "declared" / "lanes", name)
    (tmp_path / f"hintapp_{unique}.py").write_text(
        "from pipeline.runtime import App, Context\n"
        "app = App()\n"
        f"@app.handler({name!r})\n"
        "async def handle(event: bytes, ctx: Context) -> None:\n"
        "    del event, ctx\n",
        encoding="utf-8",
    )
    result = _pipeline(
        "consume",
        f"hintapp_{unique}:app",
        "-g",
        f"g-{unique}",
        "-t",
        transport,
        topics=topics,
        cwd=tmp_path,
    )
    assert name in _hint_of(result, topics)
