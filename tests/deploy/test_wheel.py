"""The wheel from `make wheel` installs into a clean venv from the lock and runs on its own.

This is the part of deploy/image/Dockerfile that can run here (no container engine): the same
wheel, the same hashed requirements/runtime.txt, a venv that has never seen the checkout, and a
working directory outside it. It installs with the locked uv (seconds from its cache); the image
installs the same files with pip's ``--require-hashes``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).parents[2]
LOCK = ROOT / "requirements" / "runtime.txt"
UV = Path(sys.executable).with_name("uv")

# Runs inside the clean venv, from an empty folder: imports every module (but the __main__ ones),
# invokes every command with --help, and reports where the package data came from.
PROBE = r"""
import importlib, json, pkgutil, sys
from importlib import resources
import typer
from typer.testing import CliRunner
import pipeline
from pipeline.cli import app

modules = [
    m.name for m in pkgutil.walk_packages(pipeline.__path__, "pipeline.")
    if not m.name.endswith(".__main__")  # runs the command line when imported
]
for name in modules:
    importlib.import_module(name)

def paths(command, prefix):
    yield prefix
    if hasattr(command, "commands"):  # a group, whichever click typer carries
        for name, sub in command.commands.items():
            yield from paths(sub, [*prefix, name])

root = typer.main.get_command(app)
runner = CliRunner()
helps = {}
for path in paths(root, []):
    result = runner.invoke(app, [*path, "--help"])
    helps[" ".join(path)] = [result.exit_code, "Usage:" in result.output]

data = {
    str(p): p.read_text(encoding="utf-8")[:200]
    for package in ("pipeline.runtime", "pipeline.retry", "pipeline.admission",
                    "pipeline.admission.debounce", "pipeline.transport.redis_streams")
    for p in resources.files(package).joinpath("lua").iterdir()
    if p.name.endswith(".lua")
}
from pipeline.logstore.sqlite import sql as sqlite_sql
from pipeline.logstore.postgres import sql as postgres_sql
from pipeline.registry.stores.sqlite import store as sqlite_store
from pipeline.registry.stores.postgres import store as postgres_store
print(json.dumps({
    "package": pipeline.__file__,
    "modules": len(modules),
    "helps": helps,
    "lua": data,
    "sql": [m.__file__ for m in (sqlite_sql, postgres_sql, sqlite_store, postgres_store)],
    "sys_path": sys.path,
}))
"""


def run(*args: str | Path, cwd: Path, env: dict[str, str] | None = None) -> str:
    """Run a command and return its stdout; a failure shows its stderr."""
    done = subprocess.run(
        [str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, f"{args}: exit {done.returncode}\n{done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """(wheel, venv, an empty working folder): the wheel installed from the lock, nothing else."""
    base = tmp_path_factory.mktemp("wheel")
    dist, venv, work = base / "dist", base / "venv", base / "work"
    work.mkdir()
    run("make", "-s", "wheel", f"DIST={dist}", cwd=ROOT)
    (wheel,) = dist.glob("pipeline-*.whl")
    run(sys.executable, "-m", "venv", "--without-pip", venv, cwd=base)
    python = venv / "bin" / "python"
    uv = (UV, "pip", "install", "-q", "--python", python, "--no-deps")
    run(*uv, "--require-hashes", "--only-binary", ":all:", "-r", LOCK, cwd=base)  # as the image
    run(*uv, wheel, cwd=base)
    return wheel, venv, work


def clean_env(venv: Path) -> dict[str, str]:
    """The environment without anything pointing back at the checkout or its venv."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env["PATH"] = f"{venv / 'bin'}:/usr/bin:/bin"
    return env


def test_the_wheel_carries_the_package_data_and_nothing_else(installed):
    """The wheel holds every Lua library, and no demo, tests or checkout files."""
    wheel, _, _ = installed
    names = set(zipfile.ZipFile(wheel).namelist())
    lua = {str(p.relative_to(ROOT)) for p in (ROOT / "pipeline").rglob("*.lua")}
    assert lua
    assert lua <= names
    assert not any(n.startswith(("demo/", "pipeline/demo/")) for n in names), sorted(names)
    assert all(n.startswith(("pipeline/", "pipeline-")) for n in names), sorted(names)


def test_the_lock_satisfies_the_wheel(installed):
    """Every dependency the wheel declares is met by requirements/runtime.txt alone."""
    _, venv, work = installed
    out = run(UV, "pip", "check", "--python", venv / "bin" / "python", cwd=work)
    assert "All installed packages are compatible" in out or out.strip() == "", out


def test_the_installed_command_prints_its_version(installed):
    """`pipeline --version` of the console script in the clean venv names the wheel's version."""
    wheel, venv, work = installed
    version = wheel.name.split("-")[1]
    out = run(venv / "bin" / "pipeline", "--version", cwd=work, env=clean_env(venv))
    assert out.strip() == f"pipeline {version}"


def test_every_command_loads_from_the_installed_package(installed):
    """Every module imports, every subcommand's --help works, and Lua and SQL come from the venv."""
    _, venv, work = installed
    out = run(venv / "bin" / "python", "-c", PROBE, cwd=work, env=clean_env(venv))
    report: dict[str, Any] = json.loads(out)
    site = str(venv)
    checkout = str(ROOT)
    assert report["package"].startswith(site)
    assert report["modules"] > 50
    assert not any(p.startswith(checkout) for p in report["sys_path"])
    for command in ("", "consume", "ingress serve", "registry serve", "topics apply", "redrive"):
        assert command in report["helps"], command
    assert len(report["helps"]) >= 20
    failed = {c: h for c, h in report["helps"].items() if h != [0, True]}
    assert not failed, failed
    assert len(report["lua"]) >= 5
    for path, head in report["lua"].items():
        assert path.startswith(site), path
        assert head.strip(), path
    assert all(path.startswith(site) for path in report["sql"])
