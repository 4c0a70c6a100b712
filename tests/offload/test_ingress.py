"""The ingress side: the body cap follows offload, and a failing store is a 503, never a 2xx."""

from __future__ import annotations

import functools
import hashlib
import logging
import uuid
from pathlib import Path

import httpx
import pytest
import yaml
from ingress.signing import hub_signature
from support import test_settings

from pipeline.config import IngressSettings, IngressSlotSettings, SweeperSettings
from pipeline.errors import ConfigError
from pipeline.ingress.app import IngressApp
from pipeline.ingress.service import build_ingress
from pipeline.ingress.settings import load_sources
from pipeline.ingress.source import Source, build_sources
from pipeline.logstore import Selection
from pipeline.logstore.sqlite import SqliteLogStore
from pipeline.offload.rows import offload_row
from pipeline.offload.store import open_store
from pipeline.offload.writer import Offloader, topic_policies
from pipeline.topics.spec import TopicSpec, load_specs
from pipeline.transport import create_transport
from pipeline.transport.protocol import TopicConfig

SECRET = "meta-app-secret"  # noqa: S105 - a test secret
MIB = 1024 * 1024


def sources(tmp_path: Path, specs: list[TopicSpec], cap: int) -> dict[str, Source]:
    """One Meta source routing to the first spec, with body cap ``cap``."""
    source = {"scheme": "meta", "secrets": [SECRET], "topic": specs[0].name, "max_body_bytes": cap}
    path = tmp_path / "sources.yaml"
    path.write_text(yaml.safe_dump({"sources": {"hooks": source}}), encoding="utf-8")
    configs = load_sources(path, {s.name for s in specs})
    return build_sources(
        configs, specs, admission=IngressSlotSettings(), max_message_bytes=MIB + 65_536
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


async def test_a_store_that_fails_gets_a_503_and_nothing_is_stored(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The body cannot be made durable in the store: 503 with Retry-After, no log row.

    The failure is one line naming the source and the store's error, not a traceback (with the
    store client's debug output) per webhook.
    """
    caplog.set_level(logging.ERROR, logger="pipeline.ingress.app")
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
    app.offload = functools.partial(offload_row, offloader)
    body = b'{"big": "' + b"x" * (2 * MIB) + b'"}'
    headers = {"x-hub-signature-256": hub_signature(SECRET, body)}
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://i")
    async with client:
        answer = await client.post("/hooks/hooks", content=body, headers=headers)
    assert answer.status_code == 503
    assert answer.headers["retry-after"] == "5"
    assert app.counters["hooks", "offload_error"] == 1
    (record,) = [r for r in caplog.records if "payload store write failed" in r.getMessage()]
    assert record.exc_info is None
    assert record.getMessage().startswith("payload store write failed on source hooks: ")
    assert str(blocked) in record.getMessage()
    assert sum((await log_store.count_by_state(Selection())).values()) == 0
    await log_store.close()


async def test_a_large_body_is_hashed_once_for_its_event_id_and_its_object_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A source without event ids: the row's id and the object's key share one digest."""
    spec = TopicSpec.model_validate(
        {"name": "big", "partitions": 1, "offload": {"store": f"file://{tmp_path}/p"}}
    )
    log_store = SqliteLogStore(tmp_path / "ingress.db")
    await log_store.open()
    app = IngressApp(sources(tmp_path, [spec], 8 * MIB), log_store, None)
    offloader = Offloader(topic_policies([spec]))
    app.offload = functools.partial(offload_row, offloader)
    body = b'{"big": "' + b"y" * (2 * MIB) + b'"}'
    digest = hashlib.sha256(body).hexdigest()
    hashed: list[int] = []
    real = hashlib.sha256

    def counting(data: bytes = b"") -> hashlib._Hash:
        hashed.append(len(data))
        return real(data)

    monkeypatch.setattr(hashlib, "sha256", counting)
    headers = {"x-hub-signature-256": hub_signature(SECRET, body)}
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://i")
    async with client:
        answer = await client.post("/hooks/hooks", content=body, headers=headers)
    monkeypatch.undo()
    assert answer.json()["status"] == "accepted"
    assert hashed.count(len(body)) == 1  # besides the signature's HMAC, one SHA-256 of the body
    (row,) = await log_store.select(Selection(), limit=10)
    assert row.event_id == f"sha256:{digest}"
    assert [o.key async for o in open_store(f"file://{tmp_path}/p").list()] == [
        f"sha256/{digest[:2]}/{digest}"
    ]
    await log_store.close()


async def test_the_served_ingress_offloads_over_a_topic_at_kafkas_default_limit(
    tmp_path: Path, kafka_service: str
) -> None:
    """`pipeline ingress serve`'s wiring: an 8 MiB cap starts, and a 2 MiB body is stored."""
    del kafka_service
    topic = f"offl_{uuid.uuid4().hex[:10]}"
    store_url = f"file://{tmp_path}/payloads"
    (tmp_path / "topics").mkdir()
    (tmp_path / "topics" / "t.yaml").write_text(
        yaml.safe_dump(
            {"name": topic, "partitions": 1, "offload": {"above": "256KiB", "store": store_url}}
        ),
        encoding="utf-8",
    )
    source = {"scheme": "meta", "secrets": [SECRET], "topic": topic, "max_body_bytes": 8 * MIB}
    (tmp_path / "sources.yaml").write_text(yaml.safe_dump({"sources": {"big": source}}))
    ingress = IngressSettings(
        sources_file=tmp_path / "sources.yaml",
        sqlite_path=tmp_path / "ingress.db",
        sweeper=SweeperSettings(enabled=False),
    )
    settings = test_settings(topics_dir=tmp_path / "topics", transport="kafka")
    admin_transport = create_transport(settings)
    admin = admin_transport.admin()
    spec = load_specs(tmp_path / "topics")[0]
    for name in spec.topic_names():  # at Kafka's default 1 MiB limit, below the 8 MiB cap
        await admin.create_topic(TopicConfig(name, 1, configs={"max.message.bytes": "1048588"}))
    built = build_ingress(settings, ingress)
    body = b'{"doc": "' + b"d" * (2 * MIB) + b'"}'
    try:
        await built.start()
        client = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=built.app), base_url="http://i"
        )
        async with client:
            answer = await client.post(
                "/hooks/big",
                content=body,
                headers={"x-hub-signature-256": hub_signature(SECRET, body)},
            )
        await built.stop()
    finally:
        for name in spec.topic_names():
            await admin.delete_topic(name)
        await admin_transport.close()
    assert answer.json()["status"] == "accepted"
    stored = [o async for o in open_store(store_url).list()]
    assert [o.size for o in stored] == [len(body)]
