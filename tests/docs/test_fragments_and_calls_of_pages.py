"""The pages' samples hold: topic fragments validate, API calls fit, the throttle sample runs.

A page's ``yaml`` block that declares topic fields (``debounce:``, ``offload:``, ``throttle:``, ...)
is read as a reader would paste it into ``topics/<name>.yaml``; each part introduced by a comment
line is a fragment of its own. A ``python`` block's calls of the classes it imports, and of the
objects it makes from them, must take the arguments shown. docs/admission.md's sample is run
against the test Redis.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError
from redis.asyncio import Redis

from pipeline.topics.spec import TopicSpec

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_FENCE = re.compile(r"^```(\w+)[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)
_TOPIC_FIELDS = {f.alias or name for name, f in TopicSpec.model_fields.items()}


def _blocks(kind: str) -> Iterator[tuple[str, str]]:
    """``(where, text)`` of every fenced block of ``kind`` on the pages."""
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for match in _FENCE.finditer(text):
            if match.group(1) == kind:
                line = text.count("\n", 0, match.start(2)) + 1
                yield f"{page.name}:{line}", match.group(2)


def _fragments(text: str) -> Iterator[str]:
    """The parts of a block, each starting at a comment line that follows declarations."""
    part: list[str] = []
    for line in text.splitlines():
        if line.startswith("#") and any(not p.startswith("#") for p in part):
            yield "\n".join(part)
            part = []
        part.append(line)
    if part:
        yield "\n".join(part)


def _topic_fragments() -> Iterator[tuple[str, dict[str, Any]]]:
    """Every yaml fragment on a page whose keys are all topic declaration fields."""
    for where, text in _blocks("yaml"):
        for fragment in _fragments(text):
            document = yaml.safe_load(fragment)
            if isinstance(document, dict) and set(document) <= _TOPIC_FIELDS:
                yield where, document


def test_the_pages_show_topic_fragments() -> None:
    """The fragments below are found (debounce.md, offload.md, admission.md, README.md)."""
    where = {w.split(":")[0] for w, _ in _topic_fragments()}
    assert {"debounce.md", "offload.md", "admission.md", "README.md"} <= where


@pytest.mark.parametrize(
    ("where", "document"), [pytest.param(w, d, id=w) for w, d in _topic_fragments()]
)
def test_every_topic_fragment_on_a_page_validates(where: str, document: dict[str, Any]) -> None:
    """A fragment given a name and partitions (when it has none) is a valid declaration."""
    declared = {"name": "sample", "partitions": 1, **document}
    try:
        TopicSpec.model_validate(declared)
    except ValidationError as exc:
        pytest.fail(f"{where}: {exc}")


def test_a_misspelt_fragment_is_refused() -> None:
    """The check above would catch a field the model does not know."""
    with pytest.raises(ValidationError):
        TopicSpec.model_validate(
            {"name": "s", "partitions": 1, "debounce": {"key": "k", "quiet": 4}}
        )


def _imported(tree: ast.Module) -> dict[str, Any]:
    """The names a block imports with ``from ... import ...``, as objects."""
    names: dict[str, Any] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            module = importlib.import_module(node.module)
            for alias in node.names:
                names[alias.asname or alias.name] = getattr(module, alias.name)
    return names


def _made(tree: ast.Module, names: dict[str, Any]) -> dict[str, type]:
    """Variables assigned an instance of an imported class: ``x = C(...)``, ``x = C.make(...)``."""
    made: dict[str, type] = {}
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1):
            continue
        target, value = node.targets[0], node.value
        value = value.value if isinstance(value, ast.Await) else value
        if not (isinstance(target, ast.Name) and isinstance(value, ast.Call)):
            continue
        func = value.func
        base = func.value if isinstance(func, ast.Attribute) else func
        if isinstance(base, ast.Name) and inspect.isclass(names.get(base.id)):
            made[target.id] = names[base.id]
    return made


def _callee(func: ast.expr, names: dict[str, Any], made: dict[str, type]) -> tuple[Any, int]:
    """What a call names, and how many arguments go before the shown ones.

    The callee is an imported class, or a method of one or of an object made from it; an
    instance's method takes its ``self`` before the arguments shown.
    """
    if isinstance(func, ast.Name) and inspect.isclass(names.get(func.id)):
        return names[func.id], 0
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
        owner = func.value.id
        if inspect.isclass(names.get(owner)):
            return getattr(names[owner], func.attr, None), 0  # a classmethod, as shown
        if owner in made:
            method = inspect.getattr_static(made[owner], func.attr, None)
            return getattr(made[owner], func.attr, None), int(inspect.isfunction(method))
    return None, 0


def _misfits(text: str) -> list[str]:
    """The calls of a python block whose arguments the callee does not take."""
    tree = ast.parse(textwrap.dedent(text))
    names = _imported(tree)
    made = _made(tree, names)
    wrong: list[str] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        callee, before = _callee(node.func, names, made)
        if callee is None or any(
            isinstance(a, ast.Starred) or (isinstance(a, ast.Constant) and a.value is ...)
            for a in node.args
        ):
            continue  # a spread or a placeholder (`C(...)`): the page shows no argument list
        try:
            signature = inspect.signature(callee)
        except ValueError:  # a builtin without one (an exception class): nothing to check
            continue
        keywords = {k.arg: None for k in node.keywords if k.arg is not None}
        try:
            signature.bind(*[None] * (before + len(node.args)), **keywords)
        except TypeError as exc:
            wrong.append(f"line {node.lineno}: {ast.unparse(node)}: {exc}")
    return wrong


def _python_blocks() -> list[Any]:
    return [pytest.param(w, t, id=w) for w, t in _blocks("python") if "from pipeline" in t]


@pytest.mark.parametrize(("where", "text"), _python_blocks())
def test_every_call_in_a_python_sample_takes_the_arguments_shown(where: str, text: str) -> None:
    """Each call of a class the sample imports, or of its methods, binds to the signature."""
    assert _misfits(text) == [], where


def test_the_call_check_catches_what_it_is_for() -> None:
    """A keyword or argument the callee does not take is reported, for a class and its objects."""
    text = (
        "from pipeline.admission.throttle import Throttle\n"
        "t = Throttle.from_settings(redis, settings)\n"
        "await t.acquire(['k'], priority=1, bogus=2)\n"
        "await t.set_limit('k', 1, 2)\n"
        "await t.status('k')\n"
    )
    assert [line.split(":")[0] for line in _misfits(text)] == ["line 3", "line 4"]


async def test_the_admission_sample_runs(
    redis: Redis, redis_service: str, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/admission.md's "Using it" sample runs as shown: the job ran, the limit is set."""
    monkeypatch.setenv("PIPELINE_REDIS__URL", redis_service)
    monkeypatch.setenv("PIPELINE_REDIS__KEY_PREFIX", prefix)
    monkeypatch.setenv("PIPELINE_THROTTLE__NAMESPACE", prefix)
    sample = next(t for w, t in _blocks("python") if w.startswith("admission.md:"))
    source = "async def sample(handle, event):\n" + textwrap.indent(sample, "    ")
    source += "    await redis.aclose()\n    return locals()\n"
    scope: dict[str, Any] = {}
    exec(compile(source, "docs/admission.md", "exec"), scope)  # noqa: S102 - the page's sample
    handled: list[str] = []

    async def handle(event: str) -> None:
        handled.append(event)

    shown = await scope["sample"](handle, "event-1")
    assert handled == ["event-1"]
    assert shown["permit"] is not None  # org:acme had room: try_acquire did not wait
    assert shown["status"].limit == 12
    assert [holder for holder, _ in shown["status"].holders] == [shown["permit"].holder]
