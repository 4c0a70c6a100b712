"""The ingress and `pipeline consume` look at their lanes' payload stores once, at start."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

from offload.helpers import closed_port, consume_idle, offload_env
from support import run_pipeline

S3PROXY_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "pipeline", "AWS_SECRET_ACCESS_KEY": "pipeline-local"}


def environment(tmp_path: Path, lane: str, **extra: str) -> dict[str, str]:
    """No AWS credentials, a lane offloading to S3Proxy, an ingress with no sources, Redis down."""
    return offload_env(tmp_path, lane, f"s3://pipeline/start-{lane}", **extra)


def refused_for_credentials(result: subprocess.CompletedProcess[str], lane: str) -> None:
    """Exit 2, one stderr line naming the store and the variables to set, no traceback."""
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert f"offload store s3://pipeline/start-{lane}: no credentials" in lines[0]
    assert "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY" in lines[0]


def test_the_ingress_without_credentials_stops_at_start(tmp_path: Path, unique: str) -> None:
    """`ingress serve` with an S3 lane and no credentials exits 2 naming the variables to set."""
    lane = f"nocreds_{unique}"
    env = environment(tmp_path, lane)
    refused_for_credentials(
        run_pipeline("ingress", "serve", "--port", "0", env=env, cwd=tmp_path), lane
    )
    workers = run_pipeline(
        "ingress", "serve", "--port", "0", "--workers", "2",
        env=env | {"PIPELINE_INGRESS__LOG_STORE": "postgres"}, cwd=tmp_path,
    )  # fmt: skip
    refused_for_credentials(workers, lane)


def test_consume_without_credentials_stops_at_start(
    redis_service: str, tmp_path: Path, unique: str
) -> None:
    """`pipeline consume` of an S3 lane without credentials exits 2 naming the variables to set."""
    lane = f"nocreds_{unique}"
    env = environment(tmp_path, lane, PIPELINE_REDIS__URL=redis_service)
    refused_for_credentials(consume_idle(tmp_path, lane, f"g-{unique}", env), lane)


def test_the_ingress_with_its_store_down_warns_once_and_serves(tmp_path: Path, unique: str) -> None:
    """A store that does not answer at start is one warning line; the ingress serves anyway."""
    lane = f"down_{unique}"
    port = closed_port()
    env = environment(tmp_path, lane, AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}")
    env |= S3PROXY_CREDENTIALS
    proc = subprocess.Popen(
        [sys.executable, "-m", "pipeline", "ingress", "serve", "--port", "0"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    errors: list[str] = []
    reader = threading.Thread(
        target=lambda: errors.extend(proc.stderr or []), daemon=True
    )  # drained, so the child never blocks on a full pipe
    reader.start()
    try:
        assert proc.stdout is not None
        listening = proc.stdout.readline()
    finally:
        proc.terminate()
        proc.communicate(timeout=30)
        reader.join(5)
    text = "".join(errors)
    assert listening.startswith("ingress listening on "), text
    assert "Traceback" not in text
    warned = [line for line in errors if f"offload store s3://pipeline/start-{lane}" in line]
    assert len(warned) == 1, text
    assert "does not answer at start" in warned[0]
    assert f"127.0.0.1:{port}" in warned[0]
