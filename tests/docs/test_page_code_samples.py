"""The pages' code samples do what they say: testing.md's test, registry.md's serde, topics.md.

A sample is the first block of its kind under a heading; it is run as a reader pastes it, with
only what the page leaves to the reader filled in (the registry's address, the record's fields).
"""

from __future__ import annotations

import ast
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from pipeline.errors import TopicSpecError
from pipeline.registry.client.events import MessageReceivedRecord
from pipeline.registry.server.api import create_app
from pipeline.registry.server.serve import BackgroundServer
from pipeline.registry.stores.sqlite.store import SqliteSchemaStore
from pipeline.topics.spec import load_specs

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


def block(page: Path, kind: str, heading: str) -> str:
    """The first ``kind`` (``python``, ``yaml``...) block after the line ``heading`` of ``page``."""
    text = "\n" + page.read_text(encoding="utf-8")
    start = text.index(f"\n{heading}\n")
    match = re.compile(rf"^```{kind}\n(.*?)^```", re.MULTILINE | re.DOTALL).search(text, start)
    assert match is not None, f"{page.name}: no {kind} block under {heading!r}"
    return match.group(1)


def test_block_finds_the_sample_under_its_heading(tmp_path: Path) -> None:
    """The block under the heading, not an earlier one, and a missing one is said."""
    page = tmp_path / "page.md"
    page.write_text("# A\n```python\nfirst = 1\n```\n## B\n\n```python\nsecond = 2\n```\n## C\n")
    assert block(page, "python", "## B") == "second = 2\n"
    with pytest.raises(AssertionError, match="no python block under '## C'"):
        block(page, "python", "## C")


async def test_the_first_test_of_the_testing_page_passes(monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/testing.md's "A first test" runs and passes against the example messages consumer."""
    monkeypatch.chdir(ROOT)  # the example App reads topics/, as the page says to run from here
    monkeypatch.syspath_prepend(str(ROOT))  # `consumers` is a folder of the project
    sample = block(DOCS / "testing.md", "python", "## A first test")
    namespace: dict[str, Any] = {"__name__": "testing_page_sample"}
    exec(compile(sample, "docs/testing.md", "exec"), namespace)  # noqa: S102 - the page's own code
    tests = [value for name, value in namespace.items() if name.startswith("test_")]
    assert len(tests) == 1, sorted(namespace)
    await tests[0]()


def test_the_testing_page_counts_the_example_tests() -> None:
    """`pytest tests/consumers  # N tests` names as many tests as tests/consumers holds."""
    page = (DOCS / "testing.md").read_text(encoding="utf-8")
    shown = re.search(r"^pytest tests/consumers\s+# (\d+) tests", page, re.MULTILINE)
    assert shown is not None, "docs/testing.md no longer shows `pytest tests/consumers  # N tests`"
    files = sorted((ROOT / "tests" / "consumers").glob("test_*.py"))
    trees = [ast.parse(path.read_text(encoding="utf-8")) for path in files]
    assert not any("parametrize" in ast.unparse(tree) for tree in trees), "count the parameters too"
    functions = (ast.FunctionDef, ast.AsyncFunctionDef)
    found = [
        node.name
        for tree in trees
        for node in tree.body
        if isinstance(node, functions) and node.name.startswith("test_")
    ]
    assert int(shown.group(1)) == len(found), found


def test_the_serde_sample_of_the_registry_page_round_trips(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/registry.md's Serde sample registers, writes the wire format and reads the model back.

    The page's ``MessageReceivedRecord(...)`` is a record of every field, and its registry
    address this run's server (a real one, on an SQLite store).
    """
    monkeypatch.chdir(ROOT)  # the sample opens schemas/message_received.avsc
    sample = block(DOCS / "registry.md", "python", "## Serde")
    assert 'RegistryClient("http://127.0.0.1:8081")' in sample
    assert "MessageReceivedRecord(...)" in sample
    record = MessageReceivedRecord(
        event_id="e-1",
        tenant="acme",
        source="meta",
        conversation_id="c-1",
        text="my lamp arrived broken",
        received_at=datetime(2026, 1, 2, 3, 4, 5, 678_000, tzinfo=UTC),
        headers={"x-request-id": "r-1"},
    )
    store = SqliteSchemaStore(str(tmp_path / "registry.db"))
    try:
        with BackgroundServer(create_app(store)) as server:
            code = sample.replace("http://127.0.0.1:8081", server.url).replace(
                "MessageReceivedRecord(...)", "record"
            )
            namespace: dict[str, Any] = {"__name__": "registry_page_sample", "record": record}
            try:
                exec(compile(code, "docs/registry.md", "exec"), namespace)  # noqa: S102
                schema_id = namespace["client"].latest("messages-value").schema_id
            finally:
                if "client" in namespace:
                    namespace["client"].close()
    finally:
        store.close()
    assert namespace["event"] == record
    assert namespace["data"][:5] == b"\x00" + schema_id.to_bytes(4, "big")


def test_the_topics_page_declaration_gives_the_topics_its_table_lists(tmp_path: Path) -> None:
    """docs/topics.md's example: main, a tier per delay, the DLQ; tiers keep 7d, the DLQ 14 days."""
    (tmp_path / "messages.yaml").write_text(
        block(DOCS / "topics.md", "yaml", "# Topic declarations")
    )
    (spec,) = load_specs(tmp_path)
    day_ms = 86_400_000
    assert [(c.name, c.partitions, c.retention_ms) for c in spec.topic_configs(1_000)] == [
        ("messages", 12, 7 * day_ms),
        ("messages.retry.5s", 12, 7 * day_ms),
        ("messages.retry.1m", 12, 7 * day_ms),
        ("messages.retry.10m", 12, 7 * day_ms),
        ("messages.dlq", 12, 14 * day_ms),
    ]


def test_the_topics_page_error_line_is_what_loading_says(tmp_path: Path) -> None:
    """The page's error example is the line a bad tier gives, file and field path included."""
    (shown,) = block(DOCS / "topics.md", "text", "## Errors").splitlines()
    declaration = block(DOCS / "topics.md", "yaml", "# Topic declarations")
    topics = tmp_path / "topics"
    topics.mkdir()
    (topics / "messages.yaml").write_text(declaration.replace("[5s, 1m, 10m]", "[5s, 1x]"))
    with pytest.raises(TopicSpecError) as raised:
        load_specs(topics)
    assert str(raised.value).replace(f"{tmp_path}/", "") == shown
