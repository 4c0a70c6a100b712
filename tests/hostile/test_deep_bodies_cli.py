"""Operators' commands on topics holding a body nested too deep for ``json``: no traceback.

``pipeline tail`` prints bodies as text (never parsed), ``pipeline replay`` produces a log
row's body as it was received (a source that reads nothing from it stores it); ``pipeline
redrive`` sends a dead letter's body back as it is, but first looks at a ``pl-offload``
message's reference through the offloading producer (to write an old object again).
``json.loads`` of ``[[[...]]]`` nested 100,000 deep raises ``RecursionError``, which that look
did not catch: the redrive ended in a traceback and moved nothing. A body that is no reference
is sent back as it is, as any other.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import httpx
import yaml
from contract.helpers import consume_until
from hostile.ingress_server import running_ingress
from offload.helpers import declared
from redis.asyncio import Redis
from support import run_pipeline, test_settings

from pipeline import headers as h
from pipeline.offload import reference as ref
from pipeline.redrive.redrive import group_name
from pipeline.redrive.select import Selection
from pipeline.topics.spec import TopicSpec
from pipeline.transport import create_transport
from pipeline.transport.protocol import Transport

DEEP = b"[" * 100_000 + b"]" * 100_000
"""A body of 200 kB, well within a message's size, nested past any recursion limit."""


def _lane(tmp_path: Path, name: str) -> tuple[TopicSpec, dict[str, str]]:
    """An offloading lane declared in ``tmp_path``'s topics, and the commands' environment."""
    store_url = f"file://{tmp_path}/payloads"
    doc = {
        "name": name,
        "partitions": 1,
        "retry": {"tiers": ["200ms"], "max_attempts": 2},
        "offload": {"above": "256KiB", "store": store_url},
    }
    topics = tmp_path / "topics"
    topics.mkdir()
    (topics / "lane.yaml").write_text(yaml.safe_dump(doc), encoding="utf-8")
    return TopicSpec.model_validate(doc), {**os.environ, "PIPELINE_TOPICS_DIR": str(topics)}


def _kind(transport: Transport) -> str:
    return "kafka" if "Kafka" in type(transport).__name__ else "redis"


async def test_tail_prints_a_deep_body(
    tmp_path: Path, transport: Transport, redis: Redis, unique: str
) -> None:
    """Plain and ``--json``: the body printed as it is, exit 0."""
    spec, env = _lane(tmp_path, f"deeptail_{unique}")
    env["PIPELINE_TRANSPORT"] = _kind(transport)
    async with declared(transport, redis, unique, spec):
        producer = transport.producer()
        await producer.send(spec.name, DEEP, key=b"k")
        await producer.close()
        plain = run_pipeline("tail", spec.name, "--from-beginning", "-n", "1", env=env)
        as_json = run_pipeline("tail", spec.name, "--from-beginning", "-n", "1", "--json", env=env)
    assert plain.returncode == 0, plain.stderr
    assert DEEP.decode() in plain.stdout
    assert as_json.returncode == 0, as_json.stderr
    assert json.loads(as_json.stdout)["value"] == DEEP.decode()


async def test_redrive_sends_a_deep_body_back(
    tmp_path: Path, transport: Transport, redis: Redis, unique: str
) -> None:
    """A dead letter with ``pl-offload`` and a deep body: counted by a dry run, then sent back."""
    spec, env = _lane(tmp_path, f"deepredrive_{unique}")
    env["PIPELINE_TRANSPORT"] = _kind(transport)
    _, offloaded = ref.reference_for(f"file://{tmp_path}/payloads", b"r" * 300_000).encode()
    origin = {h.ORIGIN_TOPIC: spec.name.encode(), h.DEAD_REASON: b"fatal"}
    async with declared(transport, redis, unique, spec):
        producer = transport.producer()
        await producer.send(spec.dead_letter, DEEP, key=b"k", headers={**offloaded, **origin})
        await producer.close()
        dry = run_pipeline("redrive", spec.dead_letter, "--dry-run", env=env)
        moved = run_pipeline("redrive", spec.dead_letter, env=env)
        admin = transport.admin()
        await admin.delete_group(
            group_name(spec.dead_letter, None, Selection.typed_as()), [spec.dead_letter]
        )
        assert dry.returncode == 0, dry.stderr
        assert "Traceback" not in dry.stderr
        assert moved.returncode == 0, moved.stderr
        reader = transport.consumer(f"check-{unique}", [spec.name])
        (back,) = await consume_until(reader, lambda r: len(r) >= 1)
        await reader.close()
        await admin.delete_group(f"check-{unique}", [spec.name])
    assert back.value == DEEP
    assert ref.is_reference(back.headers)


async def test_replay_produces_a_deep_body_again(tmp_path: Path, redis_service: str) -> None:
    """A row of a source that reads nothing from its body is produced again as it came."""
    sources = {"opaque": {"scheme": "none"}}
    async with (
        running_ingress(tmp_path, sources) as ingress,
        httpx.AsyncClient(base_url=ingress.url, timeout=30) as http,
    ):
        answer = await http.post("/hooks/opaque", content=DEEP)
        assert answer.status_code == 200, answer.text
        env = {
            **os.environ,
            "PIPELINE_TOPICS_DIR": str(tmp_path / "topics"),
            "PIPELINE_TRANSPORT": "redis",
            "PIPELINE_INGRESS__SOURCES_FILE": str(tmp_path / "sources.yaml"),
            "PIPELINE_INGRESS__SQLITE_PATH": str(tmp_path / "ingress.db"),
        }
        replayed = run_pipeline(
            "replay",
            "--id",
            answer.json()["id"],
            "--state",
            "received",
            "--state",
            "produced",
            env=env,
        )
        broker = create_transport(test_settings(transport="redis"))
        try:
            reader = broker.reader([ingress.topic], start_at="earliest")
            bodies: list[bytes] = []
            for _ in range(60):  # polls of at most a second each, until both are read
                if len(bodies) >= 2:
                    break
                bodies.extend(m.value for m in await reader.poll(10, 1.0))
            await reader.close()
        finally:
            await broker.close()
    assert replayed.returncode == 0, replayed.stderr
    assert bodies == [DEEP, DEEP]  # the fast path's produce, then the replay's
