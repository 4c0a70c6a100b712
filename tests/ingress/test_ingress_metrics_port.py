"""With a metrics port, the ingress serves /metrics there and nowhere on the webhook port."""

from __future__ import annotations

import signal

import httpx
from ingress.helpers import start_empty_ingress

from pipeline.testing.ports import free_port


def test_metrics_leave_the_webhook_port_for_their_own(redis_service, tmp_path):
    """/metrics, /healthz and /readyz answer on the metrics port; the webhook port has none."""
    metrics_port = free_port()
    proc = start_empty_ingress(
        tmp_path, redis_service, PIPELINE_INGRESS__METRICS_PORT=str(metrics_port)
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
