"""An offloaded payload reaches a ``dict`` or ``str`` handler decoded, as a small one does.

A value above the lane's ``offload.above`` travels as a ``pl-offload`` reference to S3Proxy; the
member fetches the body (digest checked) and decodes it as a JSON object or as UTF-8 text, and a
body that is neither is a ``fatal`` dead letter, on both brokers.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from contract.helpers import consume_until
from offload.helpers import declared, offload_lane, s3_prefix
from redis.asyncio import Redis
from runtime.helpers import ran_until
from support import delete_group_after

from pipeline import headers as h
from pipeline.offload import reference as ref
from pipeline.offload.writer import Offloader, OffloadingProducer, topic_policies
from pipeline.runtime import App, Context
from pipeline.topics.spec import TopicSpec
from pipeline.transport.protocol import Transport

"""What deploy/local/s3proxy.sh configures; the environment wins when it names another service."""
BIG = 300_000
"""Above the lane's 256KiB threshold: offloaded."""


@pytest.fixture
async def s3_url(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[str]:
    """A fresh prefix in S3Proxy's bucket, emptied after."""
    async with s3_prefix(monkeypatch) as url:
        yield url


async def _send_offloaded(transport: Transport, spec: TopicSpec, values: list[bytes]) -> None:
    """Send ``values`` through the offloading producer (each above the threshold)."""
    producer = OffloadingProducer(transport.producer(), Offloader(topic_policies([spec])))
    try:
        for value in values:
            assert len(value) > BIG
            await producer.send(spec.name, value, key=b"k")
    finally:
        await producer.close()


async def test_an_offloaded_json_object_reaches_a_dict_handler(
    transport: Transport, redis: Redis, s3_url: str, unique: str
) -> None:
    """The fetched body is parsed as a JSON object; an offloaded array is a dead letter (fatal)."""
    spec = offload_lane(f"offjson_{unique}", s3_url)
    got: list[dict[str, Any]] = []
    app = App([spec])

    @app.handler(spec.lane)
    async def handle(event: dict[str, Any], ctx: Context) -> None:
        got.append(event)

    document = {"order_id": "o1", "blob": "x" * BIG}
    array = json.dumps(["x" * BIG]).encode()
    async with declared(transport, redis, unique, spec):
        await _send_offloaded(transport, spec, [json.dumps(document).encode(), array])
        member = await ran_until(
            app, transport, redis, unique, lambda m: m.stats.handled + m.stats.dead_lettered >= 2
        )
        delete_group_after(transport, member.group, spec.topic_names())
        assert (member.stats.handled, member.stats.dead_lettered, member.stats.retried) == (1, 1, 0)
        assert got == [document]
        dlq = transport.consumer(f"dlq-{unique}", [spec.dead_letter])
        try:
            (dead,) = await consume_until(dlq, lambda r: len(r) >= 1)
        finally:
            await dlq.close()
    assert ref.is_reference(dead.headers)  # the reference is dead-lettered, not the body
    assert dead.headers[h.DEAD_REASON] == b"fatal"
    assert "Input should be an object" in dead.headers[h.ERROR_MESSAGE].decode()


async def test_an_offloaded_text_reaches_a_str_handler(
    transport: Transport, redis: Redis, s3_url: str, unique: str
) -> None:
    """The fetched body is decoded as UTF-8; an offloaded body not UTF-8 is a dead letter."""
    spec = offload_lane(f"offtext_{unique}", s3_url)
    got: list[str] = []
    app = App([spec])

    @app.handler(spec.lane)
    async def handle(event: str, ctx: Context) -> None:
        got.append(event)

    text = "é" * BIG
    async with declared(transport, redis, unique, spec):
        await _send_offloaded(transport, spec, [text.encode(), b"\xff" * (BIG + 1)])
        member = await ran_until(
            app, transport, redis, unique, lambda m: m.stats.handled + m.stats.dead_lettered >= 2
        )
        delete_group_after(transport, member.group, spec.topic_names())
        assert (member.stats.handled, member.stats.dead_lettered, member.stats.retried) == (1, 1, 0)
    assert got == [text]
