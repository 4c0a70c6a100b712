"""What every benchmark shares: its error, CPU time, the percentile, peers' venvs and configs.

Imported by the benchmark scripts (``bench/`` is on the path of ``python bench/x.py``), never
by the package. The percentile is the nearest rank, so a published p99 is a measured value.
"""

from __future__ import annotations

import hashlib
import json
import math
import resource
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import yaml

T = TypeVar("T")

META_POINTERS = {
    "tenant": {"pointer": "/entry/0/id"},
    "key": {"pointer": "/entry/0/changes/0/value/contacts/0/wa_id"},
    "event_id": {"pointer": "/entry/0/changes/0/value/messages/0/id"},
}
"""Where a signed Meta delivery (the benchmarks' traffic) holds the tenant, key and event id."""


class BenchError(Exception):
    """The benchmark could not complete (timeout, lost or failed messages)."""


def cpu_s() -> float:
    """CPU seconds of this process, user plus system, every thread."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def rotated(items: Sequence[T], turn: int) -> list[T]:
    """``items`` starting at position ``turn`` (modulo their count): the interleaved repeats'
    order, so no runner always goes first."""
    start = turn % len(items)
    return [*items[start:], *items[:start]]


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile by nearest rank (a value that was measured); 0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))]


def build_venv(venv: Path, requirements: Path, label: str) -> None:
    """Create ``venv`` or bring it up to ``requirements`` (re-installed when the file changes).

    The file's digest is kept in ``venv/.requirements.sha256``; ``label`` names the peers in the
    progress line. Raises BenchError with the failing step and the end of its output.
    """
    python = venv / "bin" / "python"
    stamp = venv / ".requirements.sha256"
    digest = hashlib.sha256(requirements.read_bytes()).hexdigest()
    if python.exists() and stamp.exists() and stamp.read_text().strip() == digest:
        return
    print(f"  building {venv} (peers: {label})", file=sys.stderr)
    steps = [] if python.exists() else [[sys.executable, "-m", "venv", str(venv)]]
    pip = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    steps.append([*pip, "-r", str(requirements)])
    for step in steps:
        proc = subprocess.run(step, capture_output=True, text=True, timeout=600, check=False)
        if proc.returncode != 0:
            tail = " | ".join(proc.stderr.strip().splitlines()[-3:])
            raise BenchError(f"could not build {venv} ({' '.join(step[:4])}...): {tail}")
    stamp.write_text(digest + "\n")


def package_versions(python: Path, packages: Sequence[str]) -> dict[str, str]:
    """The installed version of each of ``packages`` in the interpreter ``python``."""
    probe = (
        "import importlib.metadata as m, json, sys; "
        "print(json.dumps({p: m.version(p) for p in sys.argv[1:]}))"
    )
    proc = subprocess.run(
        [str(python), "-c", probe, *packages], capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        raise BenchError(f"{python} is broken: {proc.stderr.strip().splitlines()[-1:]}")
    versions: dict[str, str] = json.loads(proc.stdout)
    return versions


def meta_source(topic: str, *, key: bool = True) -> dict[str, Any]:
    """A source of signed Meta deliveries to ``topic`` (secret ``PIPELINE_BENCH_SECRET``)."""
    pointers = {k: dict(v) for k, v in META_POINTERS.items() if key or k != "key"}
    return {"scheme": "meta", "secrets": ["env:PIPELINE_BENCH_SECRET"], **pointers, "topic": topic}


def write_config(
    workdir: Path, specs: Sequence[Mapping[str, Any]], sources: Mapping[str, Any]
) -> None:
    """The ingress's ``topics/<lane>.yaml`` for each of ``specs`` and its ``sources.yaml``."""
    (workdir / "topics").mkdir(parents=True, exist_ok=True)
    for spec in specs:
        text = yaml.safe_dump(dict(spec))
        (workdir / "topics" / f"{spec['lane']}.yaml").write_text(text, encoding="utf-8")
    text = yaml.safe_dump({"sources": dict(sources)})
    (workdir / "sources.yaml").write_text(text, encoding="utf-8")
