"""A registry that does not answer is named by where its URL came from: `--url` or the variable.

`pipeline schemas ls --url URL` at a registry that was down told the user to point
PIPELINE_REGISTRY__URL at a running one, a variable they had not set.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest


def _closed_port() -> int:
    with socket.socket() as probe:  # bound and closed: nothing listens there
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.mark.parametrize("via_option", [True, False], ids=["--url", "variable"])
def test_an_unreachable_registry_names_the_setting_that_gave_its_url(via_option: bool) -> None:
    """One line, exit 1, naming `--url` when given, else PIPELINE_REGISTRY__URL."""
    url = f"http://127.0.0.1:{_closed_port()}"
    env = {k: v for k, v in os.environ.items() if k != "PIPELINE_REGISTRY__URL"}
    args = [sys.executable, "-m", "pipeline", "schemas", "ls"]
    if via_option:
        args += ["--url", url]
    else:
        env["PIPELINE_REGISTRY__URL"] = url
    done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=60, check=False)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 1, done.stderr
    assert len(lines) == 1, lines
    named = "--url" if via_option else "PIPELINE_REGISTRY__URL"
    assert f"cannot reach the schema registry at {url} ({named})" in lines[0]
    assert f"point {named} at a running one" in lines[0]
    other = "PIPELINE_REGISTRY__URL" if via_option else "--url"
    assert other not in lines[0]
