"""Auth settings an operator gets wrong stop `pipeline registry serve` with one line, exit 2.

Each runs the real command, as docs/registry.md's Authentication section has it. The line names
the variable and what to fix, never a secret, and nothing is opened (no store file made).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

PIPELINE = Path(sys.executable).with_name("pipeline")
USERS = "PIPELINE_REGISTRY__AUTH__USERS"
TOKENS = "PIPELINE_REGISTRY__AUTH__TOKENS"


def refused(tmp_path: Path, **extra: str) -> str:
    """Standard error of a `registry serve` that must stop at once with exit 2, in one line."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIPELINE_")}
    env.update(extra, PIPELINE_REGISTRY__STORE=f"sqlite:///{tmp_path / 'registry.db'}")
    done = subprocess.run(
        [PIPELINE, "registry", "serve", "--port", "0"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert not (tmp_path / "registry.db").exists()
    return lines[0]


def test_users_that_are_not_json_name_the_variable_not_the_password(tmp_path):
    """A cut-off JSON list (a lost bracket in a manifest) was a pydantic-settings traceback."""
    line = refused(
        tmp_path, **{USERS: '[{"username": "ci", "password": "hunter2", "role": "write"}'}
    )
    assert USERS in line
    assert "not valid JSON" in line
    assert "hunter2" not in line


def test_tokens_that_are_not_json_name_their_variable(tmp_path):
    """Tokens written as YAML-ish text, not JSON, name their own variable."""
    line = refused(tmp_path, **{TOKENS: "[{name: dashboards}]"})
    assert TOKENS in line
    assert "not valid JSON" in line


@pytest.mark.parametrize(
    ("users", "said"),
    [
        # The second entry silently replaced the first: ci's own password was refused.
        (
            (
                '[{"username": "ci", "password": "a", "role": "write"},'
                ' {"username": "ci", "password": "b", "role": "read"}]'
            ),
            "user 'ci' twice",
        ),
        # Basic auth splits user:password at the first colon: this user could never sign in.
        ('[{"username": "c:i", "password": "a", "role": "write"}]', "':'"),
        # An unset variable in a manifest (password: "$CI_PASSWORD"): "ci:" would be let in.
        ('[{"username": "ci", "password": "", "role": "write"}]', "empty password"),
    ],
)
def test_users_no_client_could_use_as_meant_are_refused(tmp_path, users, said):
    """Users the server would take but no client could use as the operator meant."""
    line = refused(tmp_path, **{USERS: users})
    assert USERS in line
    assert said in line


def test_an_empty_token_is_refused(tmp_path):
    """An empty token (an unset variable) would let ``Bearer `` in."""
    line = refused(tmp_path, **{TOKENS: '[{"name": "dash", "token": "", "role": "read"}]'})
    assert TOKENS in line
    assert "empty token" in line
