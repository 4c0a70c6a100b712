"""Large payloads end to end on both transports and both stores: by reference, never inline.

A 20 MiB signed webhook is accepted, stored once, handed to the handler intact (digest
checked), retried, dead-lettered and redriven, the broker carrying only the reference; a member
that cannot read a reference refuses it; a deleted object is a ``payload_missing`` dead letter.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import os
import sys
import time
from pathlib import Path

import yaml
from contract.helpers import consume_until
from ingress.signing import hub_signature
from offload.helpers import declared, offload_lane
from pydantic import BaseModel
from redis.asyncio import Redis
from runtime.helpers import eventually, ran_until, running, the_dead_letter

from pipeline import headers as h
from pipeline.config import IngressSlotSettings
from pipeline.ingress.app import IngressApp
from pipeline.ingress.dispatch import Dispatcher
from pipeline.ingress.republish import produce_rows
from pipeline.ingress.settings import load_sources
from pipeline.ingress.source import build_sources
from pipeline.logstore import Selection as LogSelection
from pipeline.logstore.sqlite import SqliteLogStore
from pipeline.offload import reference as ref
from pipeline.offload.lazy import LazyPayload, read_body
from pipeline.offload.rows import offload_row
from pipeline.offload.store import open_store
from pipeline.offload.writer import Offloader, OffloadingProducer, topic_policies
from pipeline.redrive.redrive import Redrive, group_name
from pipeline.redrive.select import Selection
from pipeline.runtime import App, Context
from pipeline.topics.spec import TopicSpec
from pipeline.transport.protocol import Transport

SECRET = "meta-app-secret"  # noqa: S105 - a test secret
MIB = 1024 * 1024
MAX_MESSAGE_BYTES = MIB + 65_536


def big_webhook(size: int) -> bytes:
    """A WhatsApp-like delivery padded to about ``size`` bytes."""
    change = {
        "field": "messages",
        "value": {
            "contacts": [{"wa_id": "wa-1"}],
            "messages": [{"id": "wamid.big", "text": {"body": "x" * size}}],
        },
    }
    doc = {"object": "whatsapp_business_account", "entry": [{"id": "biz-1", "changes": [change]}]}
    return json.dumps(doc).encode()


def ingress_app(
    tmp_path: Path, spec: TopicSpec, store: SqliteLogStore, transport: Transport
) -> tuple[IngressApp, Dispatcher]:
    """An ingress whose one source routes to ``spec`` with a 32 MiB body cap."""
    source = {
        "scheme": "meta",
        "secrets": [SECRET],
        "tenant": {"pointer": "/entry/0/id"},
        "key": {"pointer": "/entry/0/changes/0/value/contacts/0/wa_id"},
        "event_id": {"pointer": "/entry/0/changes/0/value/messages/0/id"},
        "topic": spec.name,
        "max_body_bytes": 32 * MIB,
    }
    path = tmp_path / "sources.yaml"
    path.write_text(yaml.safe_dump({"sources": {"whatsapp": source}}), encoding="utf-8")
    configs = load_sources(path, {spec.name})
    sources = build_sources(
        configs, [spec], admission=IngressSlotSettings(), max_message_bytes=MAX_MESSAGE_BYTES
    )
    assert sources["whatsapp"].offloads  # a 32 MiB cap is allowed because the lane offloads
    dispatcher = Dispatcher(transport.producer(), store)
    app = IngressApp(sources, store, dispatcher)
    offloader = Offloader(topic_policies([spec]))
    app.offload = functools.partial(offload_row, offloader)
    return app, dispatcher


async def test_a_20_mib_webhook_travels_by_reference_through_retry_dlq_and_redrive(
    tmp_path: Path, transport: Transport, redis: Redis, store_url: str, unique: str
) -> None:
    """Accepted once, stored once, retried, dead-lettered and redriven by reference, intact."""
    import httpx  # noqa: PLC0415 - only this test speaks HTTP

    spec = offload_lane(f"big_{unique}", store_url)
    body = big_webhook(20 * MIB)
    digest = hashlib.sha256(body).hexdigest()
    log_store = SqliteLogStore(tmp_path / "ingress.db")
    await log_store.open()
    async with declared(transport, redis, unique, spec):
        app, dispatcher = ingress_app(tmp_path, spec, log_store, transport)
        http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://i")
        signed = {"x-hub-signature-256": hub_signature(SECRET, body)}
        async with http:
            first = await http.post("/hooks/whatsapp", content=body, headers=signed)
            again = await http.post("/hooks/whatsapp", content=body, headers=signed)
        assert first.json()["status"] == "accepted"
        assert again.json()["status"] == "duplicate"
        await dispatcher.close()
        store = open_store(store_url)
        objects = [o async for o in store.list()]
        assert [(o.key, o.size) for o in objects] == [(ref.key_for(digest), len(body))]

        handled: list[tuple[int, str, str]] = []
        failing = True
        member_app = App([spec])

        @member_app.handler(spec.lane)
        async def handle(event: LazyPayload | bytes, ctx: Context) -> None:
            assert isinstance(event, LazyPayload)
            read = hashlib.sha256(await event.read()).hexdigest()
            handled.append((ctx.attempt, read, ctx.message.headers[h.TENANT].decode()))
            if failing:
                raise RuntimeError("downstream unavailable")

        member = await ran_until(
            member_app, transport, redis, unique, lambda m: m.stats.dead_lettered == 1
        )
        assert handled == [(1, digest, "biz-1"), (2, digest, "biz-1")]
        dead = await the_dead_letter(transport, spec, unique)
        assert dead.headers[h.DEAD_REASON] == b"exhausted"
        assert dead.headers[ref.SHA256] == digest.encode()
        wire = len(dead.value) + sum(len(k) + len(v) for k, v in dead.headers.items())
        assert wire < 2048  # the dead letter is the reference with its headers, not 20 MiB

        failing = False
        report = await Redrive(transport, spec.dead_letter, Selection()).run()
        assert report.moved == 1
        async with running(member):
            await eventually(lambda: member.stats.handled == 1)
        assert handled[-1] == (1, digest, "biz-1")
        assert [o.key async for o in store.list()] == [ref.key_for(digest)]  # still one object
        await transport.admin().delete_group(member.group, spec.topic_names())
    await log_store.close()


async def test_a_member_that_cannot_read_a_reference_refuses_it(
    transport: Transport, redis: Redis, store_url: str, unique: str
) -> None:
    """A lane without offload, or a newer reference format, goes to a retry tier, not a handler."""
    plain = offload_lane(f"plain_{unique}", None)
    newer = offload_lane(f"newer_{unique}", store_url)
    payload = b"p" * 300_000
    async with declared(transport, redis, unique, plain, newer):
        # The producer side has offload on both topics (a fleet mid-rollout of topics/).
        policies = topic_policies([newer])
        policies[plain.name] = policies[newer.name]
        producer = OffloadingProducer(transport.producer(), Offloader(policies))
        await producer.send(plain.name, payload, key=b"k")
        value, headers = ref.reference_for(store_url, payload).encode()
        await producer.send(newer.name, value, key=b"k", headers={**headers, ref.OFFLOAD: b"2"})
        await producer.close()

        calls: list[object] = []
        app = App([plain, newer])

        @app.handler(plain.lane)
        async def handle_plain(event: bytes, ctx: Context) -> None:
            calls.append(event)

        @app.handler(newer.lane)
        async def handle_newer(event: bytes, ctx: Context) -> None:
            calls.append(event)

        member = await ran_until(
            app, transport, redis, unique, lambda m: m.stats.dead_lettered == 2
        )
        assert calls == []
        assert member.stats.retried == 2  # each went through the retry tier first
        for spec, why in ((plain, b"no offload store"), (newer, b"format '2'")):
            dead = await the_dead_letter(transport, spec, unique)
            assert dead.headers[h.ERROR_CLASS] == b"pipeline.offload.errors.ReferenceRefused"
            assert why in dead.headers[h.ERROR_MESSAGE]
            assert ref.is_reference(dead.headers)
        await transport.admin().delete_group(
            member.group, [*plain.topic_names(), *newer.topic_names()]
        )


async def test_a_deleted_object_is_a_payload_missing_dead_letter(
    transport: Transport, redis: Redis, store_url: str, unique: str
) -> None:
    """The object gone before the member reads it: dead letter payload_missing, no handler call."""
    spec = offload_lane(f"gone_{unique}", store_url)
    payload = b"q" * 400_000
    async with declared(transport, redis, unique, spec):
        offloader = Offloader(topic_policies([spec]))
        producer = OffloadingProducer(transport.producer(), offloader)
        await producer.send(spec.name, payload, key=b"k")
        await producer.close()
        store = offloader.store(store_url)
        await store.delete(ref.key_for(hashlib.sha256(payload).hexdigest()))

        calls: list[object] = []
        app = App([spec])

        @app.handler(spec.lane)
        async def handle(event: bytes, ctx: Context) -> None:
            calls.append(event)

        member = await ran_until(
            app, transport, redis, unique, lambda m: m.stats.dead_lettered == 1
        )
        assert calls == []
        assert member.stats.retried == 0  # never a crash loop: straight to the DLQ
        dead = await the_dead_letter(transport, spec, unique)
        assert dead.headers[h.DEAD_REASON] == b"payload_missing"
        await transport.admin().delete_group(member.group, spec.topic_names())


async def test_a_retry_copy_of_a_2_day_old_reference_writes_its_object_again(
    tmp_path: Path, transport: Transport, redis: Redis, unique: str
) -> None:
    """The retry tier's copy is a new message: its object's last write must be recent again.

    The purge goes by the oldest message still held plus a day. Before, the copy pointed to an
    object last written 2 days before the copy was produced, so a purge keeping only what the
    copy's age protects deleted the payload the copy still needed.
    """
    store_url = f"file://{tmp_path}/payloads"
    spec = offload_lane(f"aged_{unique}", store_url)
    payload = b"a" * 300_000
    path = tmp_path / "payloads" / ref.key_for(hashlib.sha256(payload).hexdigest())
    async with declared(transport, redis, unique, spec):
        producer = OffloadingProducer(transport.producer(), Offloader(topic_policies([spec])))
        await producer.send(spec.name, payload, key=b"k")
        await producer.close()
        two_days_ago = time.time() - 2 * 86_400
        os.utime(path, (two_days_ago, two_days_ago))
        done: list[tuple[int, bytes]] = []
        app = App([spec])

        @app.handler(spec.lane)
        async def handle(event: LazyPayload | bytes, ctx: Context) -> None:
            body = await read_body(event)
            if ctx.attempt == 1:
                raise RuntimeError("flaky dependency")
            done.append((ctx.attempt, body))

        member = await ran_until(app, transport, redis, unique, lambda _: len(done) == 1)
        assert done == [(2, payload)]
        assert path.stat().st_mtime > two_days_ago + 86_400  # written again before the copy
        assert path.read_bytes() == payload
        await transport.admin().delete_group(member.group, spec.topic_names())


async def test_the_redrive_command_writes_a_2_day_old_object_again(
    tmp_path: Path, transport: Transport, redis: Redis, unique: str
) -> None:
    """`pipeline redrive` sends the dead letter's reference back once its object is recent.

    Before, the redriven copy pointed to an object last written 2 days before it went out, so
    the purge, which keeps what the oldest copy held may need, could delete it under the copy.
    """
    store_url = f"file://{tmp_path}/payloads"
    doc = {
        "name": f"redrive_{unique}",
        "partitions": 2,
        "retry": {"tiers": ["200ms"], "max_attempts": 2},
        "offload": {"above": "256KiB", "store": store_url},
    }
    spec = TopicSpec.model_validate(doc)
    topics = tmp_path / "topics"
    topics.mkdir()
    (topics / "lane.yaml").write_text(yaml.safe_dump(doc), encoding="utf-8")
    payload = b"r" * 300_000
    path = tmp_path / "payloads" / ref.key_for(hashlib.sha256(payload).hexdigest())
    async with declared(transport, redis, unique, spec):
        producer = OffloadingProducer(transport.producer(), Offloader(topic_policies([spec])))
        origin = {h.ORIGIN_TOPIC: spec.name.encode(), h.DEAD_REASON: b"exhausted"}
        await producer.send(spec.dead_letter, payload, key=b"k", headers=origin)
        await producer.close()
        two_days_ago = time.time() - 2 * 86_400
        os.utime(path, (two_days_ago, two_days_ago))
        env = {
            **os.environ,
            "PIPELINE_TOPICS_DIR": str(topics),
            "PIPELINE_TRANSPORT": "kafka" if "Kafka" in type(transport).__name__ else "redis",
        }
        command = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "pipeline",
            "redrive",
            spec.dead_letter,
            env=env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        _, stderr = await asyncio.wait_for(command.communicate(), 120)
        admin = transport.admin()
        redrive_group = group_name(spec.dead_letter, None, Selection.typed_as())
        await admin.delete_group(redrive_group, [spec.dead_letter])
        assert command.returncode == 0, stderr.decode()
        reader = transport.consumer(f"check-{unique}", [spec.name])
        (back,) = await consume_until(reader, lambda r: len(r) >= 1)
        await reader.close()
        await admin.delete_group(f"check-{unique}", [spec.name])
        assert back.headers[ref.SHA256] == hashlib.sha256(payload).hexdigest().encode()
        assert path.stat().st_mtime > two_days_ago + 86_400  # written again before the copy
        assert path.read_bytes() == payload


class Upload(BaseModel):
    """A typed event whose payload is large enough to be offloaded."""

    name: str
    blob: str


async def test_a_typed_handler_gets_its_model_decoded_from_the_fetched_body(
    transport: Transport, redis: Redis, store_url: str, unique: str
) -> None:
    """A pydantic handler receives the model; only the reference crossed the broker."""
    spec = offload_lane(f"typed_{unique}", store_url)
    event = Upload(name="report.pdf", blob="b" * 400_000)
    async with declared(transport, redis, unique, spec):
        producer = OffloadingProducer(transport.producer(), Offloader(topic_policies([spec])))
        await producer.send(spec.name, event.model_dump_json().encode(), key=b"k")
        await producer.close()
        got: list[tuple[Upload, int]] = []
        app = App([spec])

        @app.handler(spec.lane)
        async def handle(upload: Upload, ctx: Context) -> None:
            got.append((upload, len(ctx.message.value)))

        member = await ran_until(app, transport, redis, unique, lambda m: m.stats.handled == 1)
        ((upload, wire_value),) = got
        assert upload == event
        assert wire_value < 1024  # the message itself still holds the reference
        await transport.admin().delete_group(member.group, spec.topic_names())


async def test_a_replayed_row_produces_the_reference_again(
    tmp_path: Path, transport: Transport, redis: Redis, store_url: str, unique: str
) -> None:
    """The log row holds the reference: `pipeline replay` produces it, never the body."""
    import httpx  # noqa: PLC0415 - only the ingress tests speak HTTP

    spec = offload_lane(f"replay_{unique}", store_url)
    body = big_webhook(MIB)
    log_store = SqliteLogStore(tmp_path / "ingress.db")
    await log_store.open()
    async with declared(transport, redis, unique, spec):
        app, dispatcher = ingress_app(tmp_path, spec, log_store, transport)
        http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://i")
        async with http:
            signed = {"x-hub-signature-256": hub_signature(SECRET, body)}
            assert (await http.post("/hooks/whatsapp", content=body, headers=signed)).is_success
        await dispatcher.close()
        (row,) = await log_store.select(LogSelection(), limit=10)
        assert len(row.body) < 1024  # the log keeps the reference, not the megabyte
        producer = transport.producer()
        replayed = await produce_rows(producer, [row], replay=True)
        await producer.close()
        assert len(replayed.delivered) == 1
        consumer = transport.consumer(f"check-{unique}", [spec.name])
        got = await consume_until(consumer, lambda r: len(r) >= 2)
        await consumer.close()
        assert [m.value for m in got] == [row.body, row.body]
        assert sorted(m.headers[h.REPLAY_COUNT] for m in got) == [b"0", b"1"]
        assert all(m.headers[ref.SIZE] == str(len(body)).encode() for m in got)
        await transport.admin().delete_group(f"check-{unique}", [spec.name])
    await log_store.close()


async def test_a_parked_follower_keeps_its_reference_and_its_order(
    transport: Transport, redis: Redis, store_url: str, unique: str
) -> None:
    """Behind a retrying head, an offloaded follower is parked and handled after it, intact."""
    spec = offload_lane(f"park_{unique}", store_url)
    head, follower = b"h" * 300_000, b"f" * 500_000
    async with declared(transport, redis, unique, spec):
        producer = OffloadingProducer(transport.producer(), Offloader(topic_policies([spec])))
        await producer.send(spec.name, head, key=b"k")
        await producer.send(spec.name, follower, key=b"k")
        await producer.close()
        done: list[bytes] = []
        app = App([spec])

        @app.handler(spec.lane)
        async def handle(event: LazyPayload | bytes, ctx: Context) -> None:
            body = await event.read() if isinstance(event, LazyPayload) else event
            if body == head and ctx.attempt == 1:
                raise RuntimeError("flaky dependency")
            done.append(body)

        member = await ran_until(app, transport, redis, unique, lambda _: len(done) == 2)
        assert done == [head, follower]
        assert member.stats.parked == 1
        await transport.admin().delete_group(member.group, spec.topic_names())


class Said(BaseModel):
    """One large message of a conversation."""

    conversation_id: str
    n: int
    text: str


async def test_a_debounced_turn_resolves_its_buffered_references(
    transport: Transport, redis: Redis, store_url: str, unique: str
) -> None:
    """A debounced lane buffers references; its turn gets every large event decoded, in order."""
    # Quiet long enough that the three are one turn on a loaded host: at 0.3 s, a stall of the
    # member between two of its records let the first ones' turn fall due alone.
    quiet = {"key": "conversation_id", "quiet_s": 3, "max_wait_s": 20, "max_batch": 50}
    spec = offload_lane(f"turns_{unique}", store_url, debounce=quiet)
    events = [Said(conversation_id="c1", n=n, text=str(n) * 300_000) for n in range(3)]
    async with declared(transport, redis, unique, spec):
        producer = OffloadingProducer(transport.producer(), Offloader(topic_policies([spec])))
        for event in events:
            await producer.send(spec.name, event.model_dump_json().encode(), key=b"c1")
        await producer.close()
        turns: list[list[Said]] = []
        app = App([spec])

        @app.handler(spec.lane)
        async def handle(said: list[Said], ctx: Context) -> None:
            turns.append(said)

        member = await ran_until(app, transport, redis, unique, lambda m: m.stats.handled == 3)
        assert turns == [events]
        await transport.admin().delete_group(member.group, spec.topic_names())


async def test_a_reference_with_an_impossible_size_is_refused_not_a_crash(
    transport: Transport, redis: Redis, store_url: str, unique: str
) -> None:
    """A forged reference whose size is Infinity is a ReferenceRefused dead letter, member alive."""
    spec = offload_lane(f"forged_{unique}", store_url)
    value, headers = ref.reference_for(store_url, b"f" * 300_000).encode()
    forged = value.replace(b'"size":300000', b'"size":Infinity')
    async with declared(transport, redis, unique, spec):
        producer = transport.producer()  # not an offloading one: it is sent as forged
        await producer.send(spec.name, forged, key=b"k", headers=headers)
        await producer.close()
        app = App([spec])

        @app.handler(spec.lane)
        async def handle(event: bytes, ctx: Context) -> None:
            raise AssertionError("a forged reference reached the handler")

        member = await ran_until(
            app, transport, redis, unique, lambda m: m.stats.dead_lettered == 1
        )
        dead = await the_dead_letter(transport, spec, unique)
        assert dead.headers[h.ERROR_CLASS] == b"pipeline.offload.errors.ReferenceRefused"
        assert b"not a reference" in dead.headers[h.ERROR_MESSAGE]
        await transport.admin().delete_group(member.group, spec.topic_names())
