"""`pipeline schemas ...` against a registry with auth on, its client credentials wrong.

docs/registry.md's Authentication section, followed as an operator would: a real
`pipeline registry serve` with users, and the `schemas` commands with no, wrong, partial or
read-only credentials. Each refusal was the server's words alone (``Unauthorized: credentials
are required (HTTP 401, code 40101)``): which registry, and which variables to set, were left to
guess. Each is one line naming both; never a secret.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

PIPELINE = Path(sys.executable).with_name("pipeline")
WRITER = ("ci", "ci-secret-for-tests")
READER = ("app", "app-secret-for-tests")
SCHEMA = {"type": "record", "name": "WalkAuth", "namespace": "w71o.tests", "fields": []}


def clean_env(**extra: str) -> dict[str, str]:
    """The environment without the caller's PIPELINE_* settings, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIPELINE_")}
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A registry with a write and a read user, on its own SQLite file; stopped after."""
    tmp = tmp_path_factory.mktemp("registry")
    users = [
        {"username": WRITER[0], "password": WRITER[1], "role": "write"},
        {"username": READER[0], "password": READER[1], "role": "read"},
    ]
    proc = subprocess.Popen(
        [PIPELINE, "registry", "serve", "--port", "0"],
        cwd=tmp,
        env=clean_env(
            PIPELINE_REGISTRY__STORE=f"sqlite:///{tmp / 'registry.db'}",
            PIPELINE_REGISTRY__AUTH__USERS=json.dumps(users),
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert "registry listening on " in line, line
        yield line.split()[3]
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()


def schemas(tmp_path: Path, url: str, *args: str, **creds: str) -> subprocess.CompletedProcess[str]:
    """`pipeline schemas ARGS` at ``url`` with the client credentials ``creds``."""
    folder = tmp_path / "schemas"
    folder.mkdir(exist_ok=True)
    (folder / "walk_auth.avsc").write_text(json.dumps(SCHEMA))
    env = clean_env(PIPELINE_REGISTRY__URL=url, **{
        f"PIPELINE_REGISTRY__CLIENT_{k.upper()}": v for k, v in creds.items()
    })  # fmt: skip
    return subprocess.run(
        [PIPELINE, "schemas", *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def refused_line(done: subprocess.CompletedProcess[str], url: str) -> str:
    """Exit 1, one line naming the registry; no traceback, no password."""
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert url in lines[0], lines[0]
    assert WRITER[1] not in lines[0]
    assert READER[1] not in lines[0]
    return lines[0]


def test_no_credentials_names_the_variables_to_set(tmp_path, registry):
    """A client sent without credentials to a protected registry."""
    line = refused_line(schemas(tmp_path, registry, "ls"), registry)
    assert "40101" in line
    assert "PIPELINE_REGISTRY__CLIENT_USERNAME" in line
    assert "PIPELINE_REGISTRY__CLIENT_TOKEN" in line


def test_a_wrong_password_names_the_user_and_the_variables(tmp_path, registry):
    """The registry refused the user's password: the line says which user was presented."""
    done = schemas(tmp_path, registry, "ls", username=WRITER[0], password=WRITER[1][::-1])
    line = refused_line(done, registry)
    assert f"user {WRITER[0]!r}" in line
    assert "PIPELINE_REGISTRY__CLIENT_PASSWORD" in line


def test_a_user_without_a_password_says_the_password_is_unset(tmp_path, registry):
    """Only CLIENT_USERNAME set: the client sent an empty password."""
    line = refused_line(schemas(tmp_path, registry, "ls", username=WRITER[0]), registry)
    assert "PIPELINE_REGISTRY__CLIENT_PASSWORD is not set" in line


def test_a_reader_pushing_is_told_it_needs_a_write_user(tmp_path, registry):
    """403: the credentials are right, their role is not."""
    done = schemas(tmp_path, registry, "push", username=READER[0], password=READER[1])
    line = refused_line(done, registry)
    assert "40301" in line
    assert "write" in line
    assert f"user {READER[0]!r}" in line


def test_the_right_credentials_still_work(tmp_path, registry):
    """The writer pushes, the reader lists: nothing above changed a request that succeeds."""
    pushed = schemas(tmp_path, registry, "push", username=WRITER[0], password=WRITER[1])
    assert pushed.returncode == 0, pushed.stderr
    listed = schemas(tmp_path, registry, "ls", "--json", username=READER[0], password=READER[1])
    assert listed.returncode == 0, listed.stderr
    assert '"w71o.tests.WalkAuth"' in listed.stdout
