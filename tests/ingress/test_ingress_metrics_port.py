"""With a metrics port, the ingress serves /metrics there and nowhere on the webhook port."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx

from pipeline.testing.ports import free_port

PIPELINE = Path(sys.executable).with_name("pipeline")
ROOT = Path(__file__).parents[2]


def test_metrics_leave_the_webhook_port_for_their_own(redis_service, tmp_path):
    """/metrics, /healthz and /readyz answer on the metrics port; the webhook port has none."""
    sources = tmp_path / "sources.yaml"
    sources.write_text("sources: {}\n", encoding="utf-8")
    metrics_port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIPELINE_")}
    env |= {
        "PIPELINE_TRANSPORT": "redis",
        "PIPELINE_REDIS__URL": redis_service,
        "PIPELINE_TOPICS_DIR": str(ROOT / "topics"),
        "PIPELINE_INGRESS__SOURCES_FILE": str(sources),
        "PIPELINE_INGRESS__SQLITE_PATH": str(tmp_path / "ingress.db"),
        "PIPELINE_INGRESS__SWEEPER__ENABLED": "false",
        "PIPELINE_INGRESS__METRICS_PORT": str(metrics_port),
    }
    proc = subprocess.Popen(
        [PIPELINE, "ingress", "serve", "--port", "0"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert "ingress listening on" in line, line + (proc.stderr.read() if proc.stderr else "")
        webhook = line.split()[-1]
        metrics = f"http://127.0.0.1:{metrics_port}"
        with httpx.Client(timeout=10) as client:
            assert client.get(f"{metrics}/readyz").status_code == 200
            assert client.get(f"{metrics}/healthz").status_code == 200
            scraped = client.get(f"{metrics}/metrics")
            assert scraped.status_code == 200
            assert "pipeline_" in scraped.text
            for path in ("/metrics", "/healthz", "/readyz"):
                assert client.get(f"{webhook}{path}").status_code == 404, path
    finally:
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=60)
    # uvicorn re-raises the SIGTERM it handled once it has shut down gracefully.
    assert proc.returncode in {0, -signal.SIGTERM}, stderr
    assert "Traceback" not in stderr
