"""A Redis URL whose query redis-py cannot use is refused at start in one line, not a traceback."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

SECRET = "s3cret-redis-pw"  # noqa: S105 - a test value that must never be printed


@pytest.mark.parametrize(
    ("url", "said"),
    [
        (f"redis://app:{SECRET}@127.0.0.1:6379/0?ssl_ca_certs=/etc/ca.pem", "rediss://"),
        (f"redis://app:{SECRET}@127.0.0.1:6379/0?socket_timeout=abc", "socket_timeout"),
        (f"redis://app:{SECRET}@127.0.0.1:6379/0?sockettimeout=5", "sockettimeout"),
        (f"rediss://app:{SECRET}@127.0.0.1:6379/0?ssl_cert_reqs=bogus", "Requirements Flag: bogus"),
        (f"redis://app:{SECRET}@127.0.0.1:6379/x", "database number"),
        (f"redis://app:{SECRET}@127.0.0.1:6379/0/1", "database number"),
    ],
    ids=[
        "tls-option-on-redis-scheme",
        "bad-number",
        "unknown-option",
        "bad-cert-reqs",
        "db-not-a-number",
        "db-path-of-two-parts",
    ],
)
def test_a_redis_url_with_an_unusable_query_is_one_line(url: str, said: str) -> None:
    """The command exits 2 naming the variable and the bad option, never the password."""
    result = subprocess.run(
        [sys.executable, "-m", "pipeline", "topics", "list", "--transport", "redis"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PIPELINE_REDIS__URL": url},
        check=False,
    )
    assert "Traceback" not in result.stderr
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "PIPELINE_REDIS__URL" in lines[0]
    assert said in lines[0]
    assert SECRET not in result.stdout + result.stderr
