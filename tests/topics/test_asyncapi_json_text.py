"""``pipeline asyncapi`` of lanes whose handlers take a ``dict`` or a ``str``.

Such a lane's payload is described as what the runtime decodes (any JSON object, UTF-8 text),
not as a model and not left out; the official parser accepts the document.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from support import IN_CI

from pipeline.envelope import Message
from pipeline.runtime.app import body_adapter
from pipeline.topics.asyncapi import JsonObject, Text, document, model_of
from pipeline.topics.spec import TopicSpec

ROOT = Path(__file__).parents[2]
PARSER_DIR = Path(__file__).with_name("asyncapi")
APP = '''
from typing import Any

from pipeline.runtime import App, Context

app = App()


@app.handler("orders")
async def orders(event: dict[str, Any], ctx: Context) -> None:
    """A JSON object."""


@app.handler("notes")
async def notes(events: list[str], ctx: Context) -> None:
    """A turn of texts."""
'''

ANNOTATIONS: list[Any] = [
    dict,
    dict[str, Any],
    Mapping[str, Any],
    typing.Dict,  # noqa: UP006 - a spelling users write
    dict[str, object],
    str,
    dict[str, int],
    dict[int, Any],
    dict[str, Any] | None,
    int,
    bytes,
    Message,
    Any,
]


@pytest.mark.parametrize("kind", ANNOTATIONS, ids=[repr(k) for k in ANNOTATIONS])
def test_model_of_describes_what_the_runtime_decodes(kind: Any) -> None:
    """A JSON object for what the runtime parses as one, text for ``str``, none for the rest."""
    adapter = body_adapter(kind)
    expected = None if adapter is None else (Text if kind is str else JsonObject)
    assert model_of(kind) is expected
    assert model_of(list[kind]) is expected  # a turn's items


def test_the_payloads_are_a_json_object_and_a_string() -> None:
    """The lanes' messages point at one ``JsonObject`` and one ``Text`` schema."""
    specs = [
        TopicSpec.model_validate({"name": "orders", "partitions": 1}),
        TopicSpec.model_validate({"name": "notes", "partitions": 1}),
    ]
    models = {"orders": model_of(dict[str, Any]), "notes": model_of(list[str])}
    doc = document(
        specs,
        kafka_bootstrap="k:9092",
        redis_url="redis://r",
        models={lane: model for lane, model in models.items() if model is not None},
    )
    messages, schemas = doc["components"]["messages"], doc["components"]["schemas"]
    assert messages["orders_event"]["payload"] == {"$ref": "#/components/schemas/JsonObject"}
    assert messages["notes_event"]["payload"] == {"$ref": "#/components/schemas/Text"}
    assert messages["orders_event"]["contentType"] == "application/json"
    assert messages["notes_event"]["contentType"] == "text/plain"  # the body as sent, not JSON
    assert schemas["JsonObject"]["type"] == "object"
    assert schemas["JsonObject"]["additionalProperties"] is True
    assert schemas["Text"]["type"] == "string"
    assert "not a quoted JSON string" in schemas["Text"]["description"]


def test_the_cli_describes_an_apps_dict_and_str_lanes(tmp_path: Path) -> None:
    """``--app`` of handlers taking ``dict`` and ``list[str]``: described, parser-checked."""
    topics = tmp_path / "topics"
    topics.mkdir()
    (topics / "orders.yaml").write_text("name: orders\npartitions: 1\n", encoding="utf-8")
    (topics / "notes.yaml").write_text(
        "name: notes\npartitions: 1\ndebounce: {key: conversation_id, quiet_s: 3}\n",
        encoding="utf-8",
    )
    (tmp_path / "json_text_app.py").write_text(APP, encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "PIPELINE_TOPICS_DIR": str(topics)}
    command = [sys.executable, "-m", "pipeline", "asyncapi", str(topics)]
    out = subprocess.run(
        [*command, "--format", "json", "--app", "json_text_app:app"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    messages = doc["components"]["messages"]
    assert messages["orders_event"]["payload"] == {"$ref": "#/components/schemas/JsonObject"}
    assert messages["notes_event"]["payload"] == {"$ref": "#/components/schemas/Text"}
    assert messages["orders_event"]["contentType"] == "application/json"
    assert messages["notes_event"]["contentType"] == "text/plain"  # the body as sent, not JSON
    node = shutil.which("node")
    if node is None or not (PARSER_DIR / "node_modules" / "@asyncapi" / "parser").is_dir():
        message = "the AsyncAPI parser is not installed: run `make asyncapi-parser` (needs node 20)"
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)
    path = tmp_path / "asyncapi.json"
    path.write_text(out.stdout, encoding="utf-8")
    checked = subprocess.run(
        [node, str(PARSER_DIR / "validate.mjs"), str(path)],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    report = json.loads(checked.stdout)
    assert report["errors"] == [], report
    assert checked.returncode == 0, checked.stderr
