"""The demo main job, run headless in its short mode through the script ``make demo`` runs."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest
from redis import Redis

from demo import keys
from demo.offload import s3_environment
from demo.offload import stored as stored_objects

pytestmark = [pytest.mark.redis, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "deploy" / "local" / "demo.sh"


def _start(tmp_path: Path, prefix: str, duration: str) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "TRANSPORT": "redis",
        "DURATION": duration,
        "HEADLESS": "1",
        "DEMO_OUTPUT": str(tmp_path / "out"),
        "DEMO_PREFIX": prefix,
        "DRAIN_TIMEOUT": "40s",
    }
    return subprocess.Popen(
        ["bash", str(DEMO)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def _finish(proc: subprocess.Popen[bytes], timeout_s: float) -> tuple[int, str]:
    """Wait for the demo; on timeout interrupt it (it stops its children) and fail."""
    try:
        output, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)
        output, _ = proc.communicate(timeout=30)
        pytest.fail(f"the demo did not finish in {timeout_s}s:\n{output.decode()[-3000:]}")
    return proc.returncode, output.decode(errors="replace")


def _leftovers(prefix: str) -> list[str]:
    """Processes still running with this run's key prefix in their environment."""
    found = []
    for process in psutil.process_iter(["pid", "cmdline"]):
        try:
            if process.environ().get("PIPELINE_REDIS__KEY_PREFIX") == prefix:
                found.append(" ".join(process.info["cmdline"] or []))
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def _keys_left(url: str, prefix: str) -> int:
    with Redis.from_url(url) as redis:
        return sum(
            1 for pattern in keys.run_patterns(prefix) for _ in redis.scan_iter(match=pattern)
        )


def _runtime_passes_turns() -> bool:
    """True when the runtime gives a debounced lane's handler a list of events (a turn)."""
    from pipeline.runtime.run import load_app  # noqa: PLC0415 - imports consumers/ from ROOT

    lane = load_app("consumers.ai_turns:app").lanes["ai_turns"]
    return bool(getattr(lane, "turns", False))


def test_short_demo_loses_nothing_and_keeps_small_tenants_fast(
    redis_service, tmp_path, unique, monkeypatch
):
    """A 12 s headless run drains with no lost webhook, fast small tenants and debounced turns."""
    for name, value in s3_environment().items():  # to read the run's store afterwards
        monkeypatch.setenv(name, value)
    prefix = f"demotest{unique}"
    started = time.monotonic()
    code, output = _finish(_start(tmp_path, prefix, "12s"), timeout_s=110)
    assert code == 0, output[-3000:]
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())

    assert summary["interrupted"] is False
    assert summary["accepted"] > 500, summary
    assert summary["failed_to_send"] == 0
    assert summary["rejected"] == 0  # every webhook was signed correctly
    assert summary["audit_complete"] is True, summary
    assert summary["lost"] == 0, summary  # P1: handled, dead-lettered or in a retry tier
    assert summary["handled"] > 0
    assert summary["dead_lettered"] > 0  # the spam and empty messages of the traffic mix
    # Generous bounds: the flood may queue engagement events (no throttle is required here).
    assert summary["small_tenant_p50_wait_ms"] is not None
    assert summary["small_tenant_p50_wait_ms"] <= 5_000, summary
    assert summary["small_tenant_p99_wait_ms"] <= 30_000, summary
    assert summary["turns"] > 0
    # Attachment-sized bodies: by reference through S3Proxy when it runs, else inline.
    assert summary["large_bodies_accepted"] > 0
    if summary["offloaded_objects"] is None:
        assert "offload: off, S3Proxy is not running" in output
    else:
        assert summary["offloaded_objects"] == summary["large_bodies_accepted"], summary
        assert "offload: large bodies of the messages lane go to" in output
        assert asyncio.run(stored_objects(summary["offload_store"])) == (0, 0)  # deleted
    if _runtime_passes_turns():
        # Only with debouncing in the runtime: bursts of 2-6 messages coalesce into turns.
        assert summary["messages_per_turn"] > 1, summary
    if importlib.util.find_spec("matplotlib") is not None:
        for name in ("wait.png", "throughput.png"):
            assert (tmp_path / "out" / name).stat().st_size > 1_000

    assert _leftovers(prefix) == []
    assert _keys_left(redis_service, prefix) == 0
    assert time.monotonic() - started < 110


def test_sigint_stops_every_process_and_still_writes_a_summary(redis_service, tmp_path, unique):
    """Ctrl-C during the traffic stops every process the demo started and marks the summary."""
    prefix = f"demotest{unique}"
    proc = _start(tmp_path, prefix, "5m")
    assert proc.stdout is not None
    deadline = time.monotonic() + 90
    lines = []
    for raw in proc.stdout:  # the headless progress line shows the traffic phase
        lines.append(raw.decode(errors="replace"))
        if "traffic:" in lines[-1] or time.monotonic() > deadline:
            break
    assert any("traffic:" in line for line in lines), "".join(lines)[-3000:]
    assert len(_leftovers(prefix)) >= 6  # ingress, registry, 3 groups, sweeper, generator
    proc.send_signal(signal.SIGINT)
    code, output = _finish(proc, timeout_s=60)
    assert code == 130, output[-3000:]
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["interrupted"] is True
    if not summary["audit_complete"]:  # events still in flight are not counted as lost
        assert summary["lost"] is None, summary
    assert _leftovers(prefix) == []
    assert _keys_left(redis_service, prefix) == 0
