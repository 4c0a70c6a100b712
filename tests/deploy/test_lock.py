"""requirements/*.txt pin every package with hashes, agree with each other and with pyproject."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).parents[2]
REQUIREMENTS = ROOT / "requirements"
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)", re.MULTILINE)


def pins(path: Path) -> dict[str, str]:
    """Package name (normalised) -> pinned version."""
    text = path.read_text(encoding="utf-8")
    return {re.sub(r"[-_.]+", "-", n).lower(): v for n, v in PIN.findall(text)}


def test_every_requirement_is_pinned_with_hashes():
    """Each requirement line is an exact pin followed by at least one sha256 hash."""
    for name in ("dev.txt", "runtime.txt"):
        text = (REQUIREMENTS / name).read_text(encoding="utf-8")
        entries = re.split(r"\n(?=[A-Za-z0-9])", text.split("\n", 2)[2])
        assert len(entries) > 20, name
        for entry in entries:
            assert PIN.match(entry), f"{name}: not an exact pin: {entry.splitlines()[0]}"
            assert "--hash=sha256:" in entry, f"{name}: no hash for {entry.splitlines()[0]}"


def test_runtime_pins_are_the_dev_pins():
    """The image's lock is a subset of the developers' lock, at the same versions."""
    runtime, dev = pins(REQUIREMENTS / "runtime.txt"), pins(REQUIREMENTS / "dev.txt")
    assert {"confluent-kafka", "redis", "pydantic", "uvicorn", "psycopg"} <= set(runtime)
    assert {"pytest", "mypy", "ruff", "hatchling", "uv"} <= set(dev) - set(runtime)
    assert {n: dev.get(n) for n in runtime} == runtime


def test_the_lock_is_in_step_with_pyproject(tmp_path):
    """Re-resolving from pyproject.toml over the current lock changes no pin (run `make lock`)."""
    for name in ("dev.txt", "runtime.txt"):
        shutil.copy(REQUIREMENTS / name, tmp_path / name)
    subprocess.run(["make", "-s", "lock", f"REQS={tmp_path}"], cwd=ROOT, check=True)
    for name in ("dev.txt", "runtime.txt"):
        assert pins(tmp_path / name) == pins(REQUIREMENTS / name), f"{name} is stale: make lock"
