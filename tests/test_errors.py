"""The exception tree drawn in errors.py and the module list of pipeline.__all__ match the code.

As httpx checks its exported names, these tests keep the drawings from drifting: a new
PipelineError subclass, or a new top-level module, fails here until the docs show it.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from pathlib import Path

import pipeline
import pipeline.errors
from pipeline.errors import PipelineError

ROOT = Path(__file__).resolve().parents[1]
_BRANCH = re.compile(r"^    (?P<lead>[│ ]*)(?:[├└]── )(?P<name>[A-Z]\w*)")


def _import_every_module() -> None:
    """Import the whole package, so every subclass of PipelineError is defined."""
    for info in pkgutil.walk_packages(pipeline.__path__, "pipeline."):
        if not info.name.endswith("__main__"):
            importlib.import_module(info.name)


def _drawn_tree() -> dict[str, str]:
    """Each class name drawn in errors.py's docstring, with the name of its parent."""
    doc = pipeline.errors.__doc__ or ""
    block = doc.split("::\n\n", 1)[1].split("\n\n", 1)[0]
    lines = block.splitlines()
    assert lines[0].strip() == "PipelineError"
    parents: dict[str, str] = {}
    path = ["PipelineError"]
    for line in lines[1:]:
        match = _BRANCH.match(line)
        if match is None:
            continue  # the continuation of a description
        depth = len(match["lead"]) // 4 + 1
        del path[depth:]
        parents[match["name"]] = path[-1]
        path.append(match["name"])
    return parents


def _real_tree() -> dict[str, str]:
    """Each subclass of PipelineError defined in the package, with the name of its parent."""
    parents: dict[str, str] = {}
    todo = [PipelineError]
    while todo:
        cls = todo.pop()
        for sub in cls.__subclasses__():
            if sub.__module__.startswith("pipeline."):
                parents[sub.__name__] = cls.__name__
                todo.append(sub)
    return parents


def test_the_drawn_error_tree_is_the_real_one():
    """errors.py draws every PipelineError subclass of the package under its real parent."""
    _import_every_module()
    assert _drawn_tree() == _real_tree()


def test_all_names_every_top_level_module():
    """pipeline.__all__ lists each public top-level module and package, and nothing else."""
    modules = {
        info.name
        for info in pkgutil.iter_modules(pipeline.__path__)
        if not info.name.startswith("_")
    }
    assert set(pipeline.__all__) == modules
    assert len(pipeline.__all__) == len(set(pipeline.__all__))


def test_the_architecture_page_shows_what_all_lists():
    """docs/architecture.md's module map has one row for each name in pipeline.__all__."""
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    shown = set(re.findall(r"^\| [^|]+ \| `pipeline/([a-z_]+)(?:\.py|/)`", text, re.MULTILINE))
    assert shown == set(pipeline.__all__)
