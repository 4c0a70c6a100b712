"""A test run deletes the Redis state markers of its tests' prefixes only, never a demo's.

``{PREFIX:state}:marker`` (pipeline/runtime/state_loss.py) tells a member that its Redis lost
its data. The end of a pytest session deleted every marker written since it started, so a
``make demo`` running beside it (prefix ``fhdemo``) had its marker deleted four times and its
consumers logged, CRITICAL, that their held followers were gone and would not run.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest
from redis import Redis

from pipeline.runtime.state_loss import marker_key

pytestmark = pytest.mark.redis
ROOT = Path(__file__).resolve().parents[2]
SESSION = Path(__file__).with_name("marker_session.py")


def test_a_sessions_end_keeps_another_prefixs_marker_and_deletes_its_own(
    redis_service: str, tmp_path: Path
) -> None:
    """The demo's marker outlives the session; a test's marker written late does not."""
    foreign = marker_key(f"fhdemo{secrets.token_hex(4)}")
    uniques = tmp_path / "uniques"
    env = {
        **os.environ,
        "MARKER_SESSION_FOREIGN": foreign.removeprefix("{").removesuffix(":state}:marker"),
        "MARKER_SESSION_UNIQUES": str(uniques),
    }
    env.pop("CI", None)  # the foreign marker is left by design: reported, not failed
    env.pop("PIPELINE_TEST_LEFTOVERS", None)
    own = ""
    redis = Redis.from_url(redis_service)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(SESSION)],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=110,
            check=False,
        )
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        own = marker_key(f"t{uniques.read_text(encoding='utf-8')}")
        assert redis.exists(foreign) == 1, "the session deleted another prefix's marker"
        assert redis.exists(own) == 0, "the session left its own test's marker"
    finally:
        redis.delete(foreign, *([own] if own else []))
        redis.close()
