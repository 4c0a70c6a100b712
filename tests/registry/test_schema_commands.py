"""The registry commands: serve as a real process, and schemas push/check/ls."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
from typer.testing import CliRunner

from pipeline.registry.cli import standalone

SCHEMAS = Path(__file__).resolve().parents[2] / "schemas"
SUBJECT = "pipeline.events.MessageReceived"
runner = CliRunner()


def run(*args: str) -> tuple[int, str]:
    """Invoke the registry CLI in-process; (exit code, stdout and stderr)."""
    result = runner.invoke(standalone(), list(args))
    return result.exit_code, result.output


def evolved(tmp_path: Path, field: dict[str, object]) -> Path:
    """A copy of schemas/ whose MessageReceived has one more field."""
    schema = json.loads((SCHEMAS / "message_received.avsc").read_text())
    schema["fields"].append(field)
    folder = tmp_path / "schemas"
    folder.mkdir(parents=True)
    (folder / "message_received.avsc").write_text(json.dumps(schema))
    return folder


def test_push_dry_run_push_and_ls(sqlite_registry_url: str) -> None:
    """A dry run registers nothing; push registers under the record name; ls lists it."""
    code, out = run("schemas", "push", str(SCHEMAS), "--dry-run", "--url", sqlite_registry_url)
    assert (code, "(dry run)" in out, "new subject" in out) == (0, True, True)
    assert httpx.get(f"{sqlite_registry_url}/subjects").json() == []
    code, out = run("schemas", "push", str(SCHEMAS), "--url", sqlite_registry_url)
    assert code == 0, out
    assert f"{SUBJECT}: new subject, id 1" in out
    code, out = run("schemas", "push", str(SCHEMAS), "--url", sqlite_registry_url)
    assert f"{SUBJECT}: unchanged, id 1" in out
    code, out = run("schemas", "ls", "--json", "--url", sqlite_registry_url)
    assert json.loads(out) == {"subject": SUBJECT, "version": 1, "id": 1}


def test_check_fails_on_an_incompatible_change(sqlite_registry_url: str, tmp_path: Path) -> None:
    """Check exits 1 naming the field and rule for a breaking change, 0 for a compatible one."""
    assert run("schemas", "push", str(SCHEMAS), "--url", sqlite_registry_url)[0] == 0
    breaking = evolved(tmp_path / "a", {"name": "lang", "type": "string"})
    code, out = run("schemas", "check", str(breaking), "--url", sqlite_registry_url)
    assert code == 1
    assert "READER_FIELD_MISSING_DEFAULT_VALUE" in out
    assert "MessageReceived.lang" in out
    fine = evolved(tmp_path / "b", {"name": "lang", "type": ["null", "string"], "default": None})
    code, out = run("schemas", "check", str(fine), "--url", sqlite_registry_url)
    assert (code, "new version" in out) == (0, True)
    code, _ = run("schemas", "push", str(breaking), "--url", sqlite_registry_url)
    assert code == 1


def test_invalid_schema_file_exits_2(sqlite_registry_url: str, tmp_path: Path) -> None:
    """A malformed .avsc file is reported with its path and exit code 2."""
    (tmp_path / "bad.avsc").write_text('{"type": "record", "name": "R"}')
    code, out = run("schemas", "check", str(tmp_path), "--url", sqlite_registry_url)
    assert code == 2
    assert "bad.avsc" in out


def test_serve_starts_a_registry_process(tmp_path: Path) -> None:
    """`registry serve --port 0` prints its URL once listening and answers the real API."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIPELINE_REGISTRY__")}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pipeline.registry",
            "registry",
            "serve",
            "--port",
            "0",
            "--store",
            f"sqlite:///{tmp_path}/serve.db",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # blocks until the server announces itself (or exits)
        assert "registry listening on http://127.0.0.1:" in line, (
            proc.stderr.read() if proc.stderr else ""
        )
        url = line.split()[3]
        answer = httpx.post(f"{url}/subjects/a-value/versions", json={"schema": '"string"'})
        assert answer.json() == {"id": 1}
        assert httpx.get(f"{url}/subjects").json() == ["a-value"]
    finally:
        proc.terminate()
        proc.communicate(timeout=30)
    assert (tmp_path / "serve.db").exists()


def test_ls_into_a_pipe_keeps_long_subjects_whole(sqlite_registry_url: str, tmp_path: Path) -> None:
    """Piped, `schemas ls` prints a 100-character subject on one line instead of wrapping at 80."""
    name = "LongRecord" + "x" * 90
    (tmp_path / "long.avsc").write_text(
        json.dumps({"type": "record", "name": name, "namespace": "t", "fields": []})
    )
    assert run("schemas", "push", str(tmp_path), "--url", sqlite_registry_url)[0] == 0
    listed = subprocess.run(
        [sys.executable, "-m", "pipeline", "schemas", "ls", "--url", sqlite_registry_url],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={k: v for k, v in os.environ.items() if k != "COLUMNS"},
    )
    assert listed.returncode == 0, listed.stderr
    assert f"t.{name}" in listed.stdout
