"""`pipeline consume` marking rows processed in an SQLite log database that is not there."""

from __future__ import annotations

import os
from pathlib import Path

from support import IDLE_APP, run_pipeline


def test_a_missing_log_database_is_refused_in_one_line_not_created(
    redis_service: str, tmp_path: Path, unique: str
) -> None:
    """A mistyped PIPELINE_INGRESS__SQLITE_PATH stops the member at start, creating nothing.

    Before, the member created an empty database (and its directory) there and marked its rows
    processed in it for as long as it ran, while the ingress's own rows were never marked.
    """
    lane = f"nolog_{unique}"
    (tmp_path / "topics").mkdir()
    (tmp_path / "topics" / f"{lane}.yaml").write_text(f"name: {lane}\npartitions: 1\n")
    (tmp_path / f"nolog_{unique}.py").write_text(IDLE_APP.format(lane=lane))
    mistyped = tmp_path / "ingres" / "ingress.db"
    env = {
        **os.environ,
        "PIPELINE_TRANSPORT": "redis",
        "PIPELINE_REDIS__URL": redis_service,
        "PIPELINE_TOPICS_DIR": str(tmp_path / "topics"),
        "PIPELINE_RUNTIME__MARK_PROCESSED": "true",
        "PIPELINE_INGRESS__LOG_STORE": "sqlite",
        "PIPELINE_INGRESS__SQLITE_PATH": str(mistyped),
        "PIPELINE_MEMBERSHIP__SLOT_DIR": str(tmp_path / "slots"),
    }
    result = run_pipeline(
        "consume", f"nolog_{unique}:app", "-g", f"g-{unique}", env=env, cwd=tmp_path
    )
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, result.stderr
    assert len(lines) == 1, result.stderr
    assert str(mistyped) in lines[0]
    assert "PIPELINE_INGRESS__SQLITE_PATH" in lines[0]
    assert "PIPELINE_RUNTIME__MARK_PROCESSED" in lines[0]
    assert not mistyped.parent.exists()
