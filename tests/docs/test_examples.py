"""The examples fit together: each example webhook reaches a lane whose consumer accepts it."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest
from pydantic import BaseModel

from pipeline.config import IngressSlotSettings
from pipeline.ingress.send import signed_headers
from pipeline.ingress.settings import load_sources
from pipeline.ingress.source import build_sources
from pipeline.topics.spec import load_specs

ROOT = Path(__file__).resolve().parents[2]
WEBHOOKS = ROOT / "deploy" / "local" / "webhooks"
# (source, file) -> (lane, the conversation and text the consumer reads)
EXPECTED = {
    ("whatsapp", "whatsapp-message.json"): (
        "messages",
        "15551234567",
        "Hi, my lamp arrived broken",
    ),
    ("whatsapp", "whatsapp-empty.json"): ("messages", "15557654321", " "),
    ("whatsapp", "whatsapp-comment.json"): ("engagement", "acme_post_42", "Love the new lamps!"),
    ("github", "github-issue-comment.json"): (
        "engagement",
        "acme/lamps",
        "Same here, the shade is cracked.",
    ),
}
MODELS = {
    "messages": ("consumers.messages", "MessageReceived"),
    "engagement": ("consumers.engagement", "EngagementEvent"),
}


def consumer_model(lane: str) -> type[BaseModel]:
    """The event model of the example consumer of ``lane``."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    module, name = MODELS[lane]
    model: type[BaseModel] = getattr(importlib.import_module(module), name)
    return model


def test_every_example_webhook_is_covered() -> None:
    """Each file in deploy/local/webhooks is checked below."""
    assert sorted(p.name for p in WEBHOOKS.glob("*.json")) == sorted(f for _, f in EXPECTED)


@pytest.mark.parametrize(("source", "file"), sorted(EXPECTED))
def test_example_webhook_is_routed_to_a_consumer_that_reads_it(
    source: str, file: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The example source routes the example body to a lane whose consumer model validates it."""
    for name in ("META_APP_SECRET", "META_VERIFY_TOKEN", "GITHUB_WEBHOOK_SECRET"):
        monkeypatch.setenv(name, "dev-secret")
    specs = load_specs(ROOT / "topics")
    configs = load_sources(
        ROOT / "deploy/local/sources.example.yaml", {spec.name for spec in specs}
    )
    built = build_sources(
        configs, specs, admission=IngressSlotSettings(), max_message_bytes=1_114_112
    )
    body = (WEBHOOKS / file).read_bytes()
    headers = signed_headers(configs[source], body, 0.0)
    built[source].verifier.verify(headers, body, 0.0)
    row = built[source].build_row(headers, body, 0.0)
    lane, conversation, text = EXPECTED[source, file]
    assert row.topic == lane
    assert row.tenant == "acme"
    event = consumer_model(lane).model_validate_json(body).model_dump()
    assert (event["conversation_id"], event["text"]) == (conversation, text)


def test_the_flat_form_still_validates() -> None:
    """The flat events of `pipeline produce` and the demo keep validating unchanged."""
    message = consumer_model("messages").model_validate_json(
        b'{"conversation_id": "conv-1", "text": "hi", "tenant": "acme"}'
    )
    assert message.model_dump() == {"conversation_id": "conv-1", "text": "hi"}
    engagement = consumer_model("engagement").model_validate_json(
        b'{"conversation_id": "c", "kind": "comment", "text": "nice", "id": "1"}'
    )
    assert engagement.model_dump() == {"conversation_id": "c", "kind": "comment", "text": "nice"}
