"""The names the pages quote exist: settings, commands and options, metrics, links, make targets.

Every page is README.md and docs/*.md. Only fenced blocks and `code spans` are read for
commands, so prose may say "pipeline" freely.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer
from pydantic import BaseModel

from pipeline.cli.commands import app as cli_app
from pipeline.config import ENV_PREFIX, Settings
from pipeline.observability.metrics import FAMILIES

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
READ_APART = {
    "PIPELINE_LOG_LEVEL",
    "PIPELINE_LOG_FORMAT",
    "PIPELINE_CACHE_DIR",
    "PIPELINE_OFFLOAD_TIMEOUT_S",
}
"""Read directly, not through Settings (config.py, offload/s3.py, deploy/local/common.sh)."""
TEST_ONLY = {"PIPELINE_TEST_LEFTOVERS"}
"""The test suite's own switch (tests/conftest.py), named in README.md."""
SCRAPE_LABELS = {"pod", "instance", "job", "le"}
"""Labels Prometheus adds at scrape (and ``le`` of histogram buckets)."""
FORMER_LIBRARIES = {"pipeline_retry"}
"""A Lua library of an earlier release, named by operations.md's layout-change note."""
# A metric name followed by "*" is a family prefix (pipeline_offload_*); followed by a quote it
# is a JSON key of a benchmark's output line, not a metric.
_FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)
_SPAN = re.compile(r"`(pipeline [^`]+)`")


def _lines(page: Path) -> Iterator[tuple[int, str]]:
    """Every line of ``page`` with its number."""
    yield from enumerate(page.read_text(encoding="utf-8").splitlines(), 1)


def _fenced(page: Path) -> Iterator[tuple[int, str]]:
    """The lines of the page's fenced blocks, a line ending in a backslash joined with the next."""
    text = page.read_text(encoding="utf-8")
    for match in _FENCE.finditer(text):
        first = text.count("\n", 0, match.start(1)) + 1
        joined = ""
        for offset, line in enumerate(match.group(1).splitlines()):
            if line.rstrip().endswith("\\"):
                joined += line.rstrip()[:-1] + " "
                continue
            yield first + offset, joined + line
            joined = ""


def _variables(model: type[BaseModel], prefix: str) -> set[str]:
    """Every variable ``model`` reads, sections included (a section may be given as JSON)."""
    out: set[str] = set()
    for name, info in model.model_fields.items():
        env = f"{prefix}{name.upper()}"
        out.add(env)
        if isinstance(info.annotation, type) and issubclass(info.annotation, BaseModel):
            out |= _variables(info.annotation, env + "__")
    return out


def test_every_pipeline_variable_named_in_the_docs_is_read() -> None:
    """Each PIPELINE_* name on a page is a setting, a section of them or a variable read apart."""
    known = _variables(Settings, ENV_PREFIX) | READ_APART | TEST_ONLY
    unknown = [
        f"{page.name}:{number}: {name}"
        for page in PAGES
        for number, line in _lines(page)
        for name in re.findall(r"\bPIPELINE_[A-Z0-9_]*[A-Z0-9]", line)
        if name not in known and not any(k.startswith(name + "__") for k in known)
    ]
    assert unknown == []


def _command(words: list[str]) -> tuple[Any, list[str], str]:
    """The command ``pipeline WORDS...`` names, the words after it, and its name."""
    command: Any = typer.main.get_command(cli_app)
    path = ["pipeline"]
    rest = list(words)
    while isinstance(command, typer.core.TyperGroup) and rest and not rest[0].startswith("-"):
        sub = command.commands.get(rest[0])
        if sub is None:
            break
        command, path = sub, [*path, rest.pop(0)]
    return command, rest, " ".join(path)


def _options(command: Any) -> set[str]:
    names = {"--help"}
    for param in command.params:
        names |= set(getattr(param, "opts", ())) | set(getattr(param, "secondary_opts", ()) or ())
    return names


def _command_lines() -> Iterator[tuple[str, str, bool]]:
    """``(where, line, whole)``: a fenced line (whole) or a code span starting ``pipeline``."""
    for page in PAGES:
        for number, line in _fenced(page):
            text = line.strip().removeprefix("$ ")
            if text.startswith("pipeline "):
                yield f"{page.name}:{number}", text, True
        for number, line in _lines(page):
            for span in _SPAN.findall(line):
                yield f"{page.name}:{number}", span, False


_PLACEHOLDER = re.compile(r"[\[<{]|\.\.\.|^[A-Z][A-Z_]*$|^\w+=[A-Z]+$")


def _problems(line: str, whole: bool) -> list[str]:
    """What is wrong with one command line as the page shows it."""
    shown = re.split(r"\s#", line, maxsplit=1)
    command_text = re.split(r"\s(?:\||&&|;|>|2>)\s", shown[0])[0]
    try:
        args = shlex.split(command_text)[1:]
    except ValueError:
        return []  # an unbalanced quote in a span cut short: nothing to check
    command, rest, name = _command(args)
    if isinstance(command, typer.core.TyperGroup):
        if rest and not rest[0].startswith("-") and not _PLACEHOLDER.search(rest[0]):
            return [f"{name} has no command {rest[0]!r}"]
        return []
    options = _options(command)
    flags = re.findall(r"(?<![\w-])(--[a-z][\w-]*)", " ".join([*rest, *shown[1:]]))
    problems = [f"{name} has no option {flag}" for flag in flags if flag not in options]
    if whole and not problems and not any(_PLACEHOLDER.search(arg) for arg in rest):
        try:
            command.make_context(name, list(rest))
        except SystemExit:
            pass
        except Exception as exc:  # the parser's usage errors, as a user sees them
            problems.append(f"{name}: {exc}")
    return problems


def test_every_command_and_option_named_in_the_docs_exists() -> None:
    """Each ``pipeline ...`` line names a command that takes the options, and arguments, shown."""
    found = [
        f"{where}: {problem} ({line})"
        for where, line, whole in _command_lines()
        for problem in _problems(line, whole)
    ]
    assert found == []


def _libraries() -> set[str]:
    """The Redis Functions libraries' names (``#!lua name=...``), which look like metrics."""
    header = re.compile(r"^#!lua name=(\w+)", re.MULTILINE)
    return {
        match
        for path in (ROOT / "pipeline").rglob("*.lua")
        for match in header.findall(path.read_text(encoding="utf-8"))
    }


def test_every_metric_named_in_the_docs_is_exported_with_its_labels() -> None:
    """Each ``pipeline_*`` metric a page names is a family (or its samples) with those labels."""
    families = {name: f for f in FAMILIES for name in (f.name, *f.exposed_names())}
    libraries = _libraries() | FORMER_LIBRARIES
    wrong: list[str] = []
    for page in PAGES:
        for number, line in _lines(page):
            for match in re.finditer(r"\b(pipeline_[a-z0-9_]*[a-z0-9])(\{[^}]*\})?", line):
                name, labels = match.groups()
                family = families.get(name)
                base = re.sub(r"_[0-9a-f]{8}$", "", name)
                if family is None:
                    after = line[match.end() :]
                    if base not in libraries and not after.startswith(("*", '"')):
                        wrong.append(f"{page.name}:{number}: no metric {name}")
                    continue
                wrong += [
                    f"{page.name}:{number}: {name} has no label {label}"
                    for label in re.findall(r"(\w+)\s*(?:=~|!=|!~|=)", labels or "")
                    if label not in family.labels and label not in SCRAPE_LABELS
                ]
    assert wrong == []


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "")
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    text = _FENCE.sub("", page.read_text(encoding="utf-8"))
    seen: dict[str, int] = {}
    out: set[str] = set()
    for heading in re.findall(r"^#{1,6}\s+(.*)$", text, re.MULTILINE):
        slug = _slug(heading)
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        out.add(slug if count == 0 else f"{slug}-{count}")
    return out


def test_every_link_between_pages_resolves() -> None:
    """Each relative link names a file of the repository and, into a page, one of its headings."""
    broken: list[str] = []
    for page in PAGES:
        text = _FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), page.read_text("utf-8"))
        for number, line in enumerate(text.splitlines(), 1):
            for target in re.findall(r"\]\(([^)\s]+)\)", line):
                if re.match(r"[a-z]+:", target):
                    continue
                file, _, anchor = target.partition("#")
                dest = (page.parent / file).resolve() if file else page
                if not dest.exists():
                    broken.append(f"{page.name}:{number}: no file {target}")
                elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                    broken.append(f"{page.name}:{number}: no heading for {target}")
    assert broken == []


def test_every_make_target_named_in_the_docs_exists() -> None:
    """Each ``make TARGET`` in a fenced block or code span is a target of the Makefile."""
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    targets = set(re.findall(r"^([a-z][\w-]*):", makefile, re.MULTILINE))
    missing: list[str] = []
    for page in PAGES:
        for number, line in _lines(page):
            for code in re.findall(r"`([^`]*)`", line):
                missing += [
                    f"{page.name}:{number}: make {t}"
                    for t in re.findall(r"(?:^|\s)make ([a-z][\w-]*\b)(?![-<])", code)
                    if t not in targets
                ]
        for number, line in _fenced(page):
            missing += [
                f"{page.name}:{number}: make {t}"
                for t in re.findall(r"^\s*make ([a-z][\w-]*)", line)
                if t not in targets
            ]
    assert missing == []


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ("pipeline status --bogus", "pipeline status has no option --bogus"),
        ("pipeline nosuch", "pipeline has no command 'nosuch'"),
        ("pipeline redrive messages.dlq   # [--since 2h] [--bogus X]", "--bogus"),
        ("pipeline throttle status a b c", "unexpected extra argument"),
    ],
)
def test_the_command_check_catches_what_it_is_for(line: str, problem: str) -> None:
    """An unknown option, command or extra argument is reported, in the line or its comment."""
    assert any(problem in p for p in _problems(line, whole=True))
