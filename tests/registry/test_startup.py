"""Registry start-up: one source of truth for several processes, and no open door when told not.

Each test runs `pipeline registry serve` as its own process, as a Deployment's replicas do.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import quote

import httpx
import psycopg
import pytest

PIPELINE = Path(sys.executable).with_name("pipeline")
WRITER = ("deployer", "s3cret-for-tests")
SCHEMAS = 12


def serve_env(**extra: str) -> dict[str, str]:
    """The environment without PIPELINE_* settings of the caller, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIPELINE_")}
    env.update(extra)
    return env


def refusal(tmp_path: Path, **extra: str) -> subprocess.CompletedProcess[str]:
    """`pipeline registry serve` with ``extra`` settings, expected to stop at once."""
    return subprocess.run(
        [PIPELINE, "registry", "serve", "--port", "0"],
        cwd=tmp_path,
        env=serve_env(**extra),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_a_registry_told_it_has_peers_refuses_sqlite(tmp_path):
    """REPLICAS=2 on an SQLite store stops the server with one line naming the fix, no file made."""
    done = refusal(
        tmp_path,
        PIPELINE_REGISTRY__REPLICAS="2",
        PIPELINE_REGISTRY__STORE=f"sqlite:///{tmp_path / 'registry.db'}",
    )
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "PIPELINE_REGISTRY__REPLICAS=2" in lines[0]
    assert "PIPELINE_REGISTRY__STORE=postgresql://" in lines[0]
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "registry.db").exists()


def test_the_default_sqlite_store_still_serves_one_replica(tmp_path):
    """Without peers the embedded default is allowed: the refusal is about replicas, not SQLite."""
    proc = subprocess.Popen(
        [PIPELINE, "registry", "serve", "--port", "0"],
        cwd=tmp_path,
        env=serve_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert "registry listening on http://127.0.0.1:" in proc.stdout.readline()
    finally:
        stop(proc)


def test_a_registry_that_requires_auth_refuses_to_start_without_credentials(tmp_path):
    """REQUIRE_AUTH with no users and no tokens stops the server with one line."""
    done = refusal(tmp_path, PIPELINE_REGISTRY__REQUIRE_AUTH="true")
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    assert "PIPELINE_REGISTRY__AUTH__USERS" in line


def stop(proc: subprocess.Popen[str]) -> None:
    """Interrupt a server as Kubernetes would and wait for it to exit."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.communicate(timeout=30)  # also closes its pipes
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()


@pytest.fixture
def pg_url(postgres_service: str) -> Iterator[str]:
    """The PostgreSQL URL with a uuid-named schema first on the search path, dropped afterwards."""
    schema = f"registry_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(postgres_service, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    sep = "&" if "?" in postgres_service else "?"
    yield f"{postgres_service}{sep}options={quote(f'-csearch_path={schema}')}"
    with psycopg.connect(postgres_service, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


@pytest.fixture
def two_replicas(pg_url: str, tmp_path: Path) -> Iterator[list[str]]:
    """Two `pipeline registry serve` processes on one PostgreSQL store, auth on: their URLs."""
    users = [{"username": WRITER[0], "password": WRITER[1], "role": "write"}]
    env = serve_env(
        PIPELINE_REGISTRY__REPLICAS="2",
        PIPELINE_REGISTRY__REQUIRE_AUTH="true",
        PIPELINE_REGISTRY__STORE=pg_url,
        PIPELINE_REGISTRY__AUTH__USERS=json.dumps(users),
    )
    procs = [
        subprocess.Popen(
            [PIPELINE, "registry", "serve", "--port", "0"],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    try:
        urls = []
        for proc in procs:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            assert "auth on" in line, line + (proc.stderr.read() if proc.stderr else "")
            urls.append(line.split()[3])
        yield urls
    finally:
        for proc in procs:
            stop(proc)


def schema_text(i: int) -> str:
    """A distinct record schema per ``i``."""
    fields = [{"name": f"f{i}", "type": "string"}]
    return json.dumps({"type": "record", "name": f"Evt{i}", "fields": fields})


def test_two_registry_processes_on_one_postgres_agree(two_replicas):
    """Racing registrations on two processes give one id per schema; every lookup agrees."""
    clients = [httpx.Client(base_url=url, auth=WRITER, timeout=30) for url in two_replicas]
    barrier = threading.Barrier(2)

    def register(which: int, i: int) -> int:
        barrier.wait(timeout=30)
        body = {"schema": schema_text(i)}
        response = clients[which].post(f"/subjects/s{i}-{which}/versions", json=body)
        assert response.status_code == 200, response.text
        return int(response.json()["id"])

    try:
        assert httpx.get(two_replicas[0] + "/subjects").status_code == 401
        ids: dict[int, int] = {}
        with ThreadPoolExecutor(2) as pool:
            for i in range(SCHEMAS):
                # Both processes insert the same new schema at the same moment, under two subjects.
                a, b = pool.map(register, (0, 1), (i, i))
                assert a == b, f"schema {i}: id {a} on one replica, {b} on the other"
                ids[i] = a
        assert len(set(ids.values())) == SCHEMAS
        for i, schema_id in ids.items():
            seen = [c.get(f"/schemas/ids/{schema_id}").json()["schema"] for c in clients]
            assert seen[0] == seen[1]
            assert json.loads(seen[0])["name"] == f"Evt{i}"
            for which in (0, 1):
                versions = [c.get(f"/subjects/s{i}-{which}/versions/1").json() for c in clients]
                assert versions[0] == versions[1]
                assert versions[0]["id"] == schema_id
        # A schema only one process saw is known to the other under the same id.
        body = {"schema": schema_text(SCHEMAS)}
        lone = clients[0].post("/subjects/lone-value/versions", json=body).json()["id"]
        assert lone not in ids.values()
        other = clients[1].get(f"/schemas/ids/{lone}").json()["schema"]
        assert json.loads(other)["name"] == f"Evt{SCHEMAS}"
        subjects = [sorted(c.get("/subjects").json()) for c in clients]
        assert subjects[0] == subjects[1]
        assert len(subjects[0]) == 2 * SCHEMAS + 1
    finally:
        for client in clients:
            client.close()
