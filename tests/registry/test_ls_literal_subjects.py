"""`schemas ls` prints a subject as it was registered, whatever rich would read in it.

Any client may register a subject: ``[/x]`` in one stopped `pipeline schemas ls` with rich's
MarkupError traceback, and ``:a:`` printed an emoji.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import httpx

SUBJECT = "odd[/x]:a:[bold]-value"
SCHEMA = {"type": "record", "name": "Odd", "namespace": "t", "fields": []}


def test_ls_prints_a_subject_with_brackets_and_colons_as_registered(
    sqlite_registry_url: str,
) -> None:
    """Registered over HTTP as any client may: listed literally, exit 0."""
    posted = httpx.post(
        f"{sqlite_registry_url}/subjects/{SUBJECT.replace('/', '%2F')}/versions",
        json={"schema": json.dumps(SCHEMA)},
        timeout=30,
    )
    assert posted.status_code == 200, posted.text
    listed = subprocess.run(
        [sys.executable, "-m", "pipeline", "schemas", "ls", "--url", sqlite_registry_url],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "COLUMNS": "300"},
    )
    assert listed.returncode == 0, listed.stderr
    assert SUBJECT in listed.stdout
