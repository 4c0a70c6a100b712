"""docs/glossary.md agrees with the metric families and the header names."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from pipeline import headers
from pipeline.observability.metrics import FAMILIES

GLOSSARY = Path(__file__).parents[2] / "docs" / "glossary.md"
ROW = re.compile(r"^\| `(pipeline_[a-z0-9_]+)` \| (\w+) \| ([^|]*) \|", re.MULTILINE)


def test_every_metric_family_is_in_the_glossary_with_its_type_and_labels():
    """The glossary's metric table lists exactly the defined families, types and labels."""
    rows = {
        name: (kind, tuple(re.findall(r"`(\w+)`", labels)))
        for name, kind, labels in ROW.findall(GLOSSARY.read_text(encoding="utf-8"))
    }
    defined = {family.name: (family.kind, family.labels) for family in FAMILIES}
    assert rows == defined


def test_every_header_is_in_the_glossary():
    """Each header name of pipeline/headers.py has a row in the glossary."""
    text = GLOSSARY.read_text(encoding="utf-8")
    names = [
        v
        for k, v in vars(headers).items()
        if k.isupper() and not k.startswith("_") and isinstance(v, str)
    ]
    assert names
    missing = [name for name in names if f"| `{name}` |" not in text]
    assert missing == []


_SOURCE_NAMES = """
import ast, json, pathlib, sys
names = set()
for path in pathlib.Path(sys.argv[1]).rglob("*.py"):
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(node, ast.ClassDef):
            continue
        if not any(
            isinstance(item, ast.AsyncFunctionDef) and item.name == "refresh" for item in node.body
        ):
            continue
        for item in node.body:
            if (
                isinstance(item, ast.Assign)
                and [getattr(t, "id", None) for t in item.targets] == ["name"]
                and isinstance(item.value, ast.Constant)
            ):
                names.add(item.value.value)
print(json.dumps(sorted(names)))
"""


def _refresh_source_names() -> set[str]:
    """The ``name`` of every snapshot source class under pipeline/ (a class with an async refresh).

    It is the ``source`` label of ``pipeline_metrics_refresh_errors_total``. The sources are
    parsed in a fresh interpreter: Python 3.11 keeps the AST constructor's depth in state shared
    by the whole process, so an ``ast.parse`` here that overlaps another (a thread left by an
    earlier test formatting a traceback: 3.11's tracebacks parse their source lines) failed once
    with "AST constructor recursion depth mismatch" (CPython gh-106905).
    """
    found = subprocess.run(
        [sys.executable, "-c", _SOURCE_NAMES, str(GLOSSARY.parents[1] / "pipeline")],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return set(json.loads(found.stdout))


def test_every_refresh_source_is_a_documented_source_label_value():
    """Each snapshot source's name, the refresh error counter's source label, is in the glossary."""
    sources = _refresh_source_names()
    assert {"group_lag", "log_store", "debounce_overdue"} <= sources
    text = GLOSSARY.read_text(encoding="utf-8").partition("### Label values")[2]
    (row,) = re.findall(r"^\| `source` \|(.*)$", text, re.MULTILINE)
    documented = set(re.findall(r"`(\w+)`", row.partition("refresh errors:")[2]))
    assert sorted(sources - documented) == []
    assert sorted(documented - sources) == []
