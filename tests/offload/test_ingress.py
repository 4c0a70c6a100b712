"""The ingress side: the body cap follows offload, and a failing store is a 503, never a 2xx."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
import yaml
from ingress.signing import hub_signature

from pipeline.errors import ConfigError
from pipeline.ingress.app import IngressApp
from pipeline.ingress.settings import AdmissionSettings, load_sources
from pipeline.ingress.source import Source, build_sources
from pipeline.logstore import Selection
from pipeline.logstore.sqlite import SqliteLogStore
from pipeline.offload.rows import offload_row
from pipeline.offload.writer import Offloader, topic_policies
from pipeline.topics.spec import TopicSpec

SECRET = "meta-app-secret"  # noqa: S105 - a test secret
MIB = 1024 * 1024


def sources(tmp_path: Path, specs: list[TopicSpec], cap: int) -> dict[str, Source]:
    """One Meta source routing to the first spec, with body cap ``cap``."""
    source = {"scheme": "meta", "secrets": [SECRET], "topic": specs[0].name, "max_body_bytes": cap}
    path = tmp_path / "sources.yaml"
    path.write_text(yaml.safe_dump({"sources": {"hooks": source}}), encoding="utf-8")
    configs = load_sources(path, {s.name for s in specs})
    return build_sources(
        configs, specs, admission=AdmissionSettings(), max_message_bytes=MIB + 65_536
    )


def test_a_cap_above_the_message_size_needs_an_offloading_lane(tmp_path: Path) -> None:
    """8 MiB is refused at start for an inline lane and allowed for an offloading one."""
    inline = TopicSpec.model_validate({"name": "plain", "partitions": 1})
    with pytest.raises(ConfigError, match="leaves no room"):
        sources(tmp_path, [inline], 8 * MIB)
    offloading = TopicSpec.model_validate(
        {"name": "big", "partitions": 1, "offload": {"store": f"file://{tmp_path}/p"}}
    )
    assert sources(tmp_path, [offloading], 8 * MIB)["hooks"].offloads


async def test_a_store_that_fails_gets_a_503_and_nothing_is_stored(tmp_path: Path) -> None:
    """The body cannot be made durable in the store: 503 with Retry-After, no log row."""
    blocked = tmp_path / "not-a-directory"
    blocked.write_text("a file where the store's directory should be")
    spec = TopicSpec.model_validate(
        {"name": "big", "partitions": 1, "offload": {"store": f"file://{blocked}"}}
    )
    built = sources(tmp_path, [spec], 8 * MIB)
    log_store = SqliteLogStore(tmp_path / "ingress.db")
    await log_store.open()
    app = IngressApp(built, log_store, None)
    offloader = Offloader(topic_policies([spec]))
    app.offload = lambda row: offload_row(offloader, row)
    body = b'{"big": "' + b"x" * (2 * MIB) + b'"}'
    headers = {"x-hub-signature-256": hub_signature(SECRET, body)}
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://i")
    async with client:
        answer = await client.post("/hooks/hooks", content=body, headers=headers)
    assert answer.status_code == 503
    assert answer.headers["retry-after"] == "5"
    assert app.counters["hooks", "offload_error"] == 1
    assert sum((await log_store.count_by_state(Selection())).values()) == 0
    await log_store.close()
