"""`pipeline registry serve` stopped by a signal exits 0 after its clean stop, as the ingress does.

uvicorn raises a stop signal it caught once more when it has served, so the process died of it
(-15 to its parent): a Kubernetes Pod showed the registry container as "Error" on every rollout.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

PIPELINE = Path(sys.executable).with_name("pipeline")


def free_port() -> int:
    """A port nothing listens on now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_stop_signal_ends_the_registry_with_exit_0_and_one_stop_line(tmp_path, stop):
    """Serving on SQLite, then the signal: exit 0, the stop line on stdout, nothing on stderr."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIPELINE_")}
    proc = subprocess.Popen(
        [
            PIPELINE,
            "registry",
            "serve",
            "--port",
            str(port),
            "--store",
            f"sqlite:///{tmp_path / 'registry.db'}",
        ],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        listening = proc.stdout.readline()
        assert f"registry listening on http://127.0.0.1:{port}" in listening, listening
        assert httpx.get(f"http://127.0.0.1:{port}/subjects", timeout=10).json() == []
        proc.send_signal(stop)
        stdout, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, (proc.returncode, stderr)
    assert stdout.splitlines() == [f"registry stopped on {stop.name}"], stdout
    assert stderr == ""
