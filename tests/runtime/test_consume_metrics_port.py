"""`pipeline consume` with a metrics port it cannot listen on: one line, before it joins."""

from __future__ import annotations

import os
import socket
from pathlib import Path

from support import IDLE_APP, run_pipeline


def test_a_busy_metrics_port_is_one_line_naming_the_variable(
    redis_service: str, tmp_path: Path, unique: str
) -> None:
    """Another process holds the port: exit 2 with the address and the variable, no uvicorn line.

    Before, uvicorn's own "error while attempting to bind" line came out, with exit code 3 and
    no word of which setting chose the port.
    """
    lane = f"busyport_{unique}"
    (tmp_path / "topics").mkdir()
    (tmp_path / "topics" / f"{lane}.yaml").write_text(f"name: {lane}\npartitions: 1\n")
    (tmp_path / f"busy_{unique}.py").write_text(IDLE_APP.format(lane=lane))
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        env = {
            **os.environ,
            "PIPELINE_TRANSPORT": "redis",
            "PIPELINE_REDIS__URL": redis_service,
            "PIPELINE_TOPICS_DIR": str(tmp_path / "topics"),
            "PIPELINE_RUNTIME__METRICS_HOST": "127.0.0.1",
            "PIPELINE_RUNTIME__METRICS_PORT": str(port),
        }
        result = run_pipeline(
            "consume", f"busy_{unique}:app", "-g", f"g-{unique}", env=env, cwd=tmp_path
        )
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, result.stderr
    assert len(lines) == 1, result.stderr
    assert f"127.0.0.1:{port}" in lines[0]
    assert "PIPELINE_RUNTIME__METRICS_PORT" in lines[0]
    assert "another process holds it" in lines[0]
