"""Bodies nested too deep for ``json`` in a real member: read as any unreadable body, not raised.

``json.loads`` of ``[[[...]]]`` nested 100,000 deep raises ``RecursionError``, no ``ValueError``.
A debounced lane reading its conversation key from a body field caught only ``ValueError``: the
message was dead-lettered instead of buffered under its message key. A ``pl-offload`` message
whose body is no reference caught ``ValueError`` and a few others: the ``RecursionError`` went
up as a handler failure, and again from the offloading producer's look at the reference as its
retry copy was sent, so the message failed before it was routed and was left for redelivery,
again and again, its key's followers held behind it.
"""

from __future__ import annotations

from pathlib import Path

from offload.helpers import declared, offload_lane
from pydantic import BaseModel
from redis.asyncio import Redis
from runtime.helpers import lane_spec, produce, ran_until, the_dead_letter

from pipeline import headers as h
from pipeline.envelope import Record
from pipeline.offload import reference as ref
from pipeline.runtime import App, Context
from pipeline.transport.protocol import Transport

DEEP = b"[" * 100_000 + b"]" * 100_000
"""A body of 200 kB, well within a message's size, nested past any recursion limit."""
QUIET = {"key": "conversation_id", "quiet_s": 3, "max_wait_s": 20, "max_batch": 50}
"""Quiet long enough that both messages, read together, are one turn on a loaded host."""


class Said(BaseModel):
    """One message of a conversation."""

    conversation_id: str


async def test_a_deep_body_on_a_debounced_lane_is_keyed_by_its_message_key(
    transport: Transport, redis: Redis, unique: str
) -> None:
    """It takes its conversation from the message key, as a body that is no JSON does."""
    spec = lane_spec(f"deepturn_{unique}", 1, debounce=QUIET, retry={"max_attempts": 2})
    turns: list[list[bytes]] = []
    async with declared(transport, redis, unique, spec):
        records = [Record(DEEP, b"c1"), Record(b'{"conversation_id": "c1"}', b"other")]
        await produce(transport, spec.name, records)
        app = App([spec])

        @app.handler(spec.lane)
        async def handle(events: list[bytes], ctx: Context) -> None:
            turns.append(events)

        member = await ran_until(app, transport, redis, unique, lambda m: m.stats.handled == 2, 30)
        # One conversation, c1 (two message keys: the two may be buffered in either order).
        assert [sorted(turn) for turn in turns] == [[DEEP, b'{"conversation_id": "c1"}']]
        assert (member.stats.retried, member.stats.dead_lettered) == (0, 0)
        await transport.admin().delete_group(member.group, spec.topic_names())


async def test_a_deep_body_as_a_reference_is_refused_not_a_handler_failure(
    transport: Transport, redis: Redis, tmp_path: Path, unique: str
) -> None:
    """A ``pl-offload`` message whose body is nested too deep is a ReferenceRefused dead letter.

    As a body that is no reference: through the retry tier with that reason, the handler never
    called, the member alive for the next message.
    """
    spec = offload_lane(f"deepref_{unique}", f"file://{tmp_path}/payloads")
    _, headers = ref.reference_for(f"file://{tmp_path}/payloads", b"f" * 300_000).encode()
    async with declared(transport, redis, unique, spec):
        producer = transport.producer()  # not an offloading one: it is sent as forged
        await producer.send(spec.name, DEEP, key=b"k", headers=headers)
        await producer.send(spec.name, b"next", key=b"k2")  # not its follower
        await producer.close()
        app = App([spec])
        calls: list[bytes] = []

        @app.handler(spec.lane)
        async def handle(event: bytes, ctx: Context) -> None:
            calls.append(event)

        member = await ran_until(
            app,
            transport,
            redis,
            unique,
            lambda m: m.stats.dead_lettered == 1 and calls == [b"next"],
            30,
        )
        dead = await the_dead_letter(transport, spec, unique)
        assert dead.headers[h.ERROR_CLASS] == b"pipeline.offload.errors.ReferenceRefused"
        assert b"not a reference" in dead.headers[h.ERROR_MESSAGE]
        assert dead.value == DEEP
        await transport.admin().delete_group(member.group, spec.topic_names())


async def test_a_deep_body_on_a_typed_lane_is_dead_lettered_at_once(
    transport: Transport, redis: Redis, unique: str
) -> None:
    """Pydantic refuses it as invalid JSON: a validation dead letter, never retried."""
    spec = lane_spec(f"deeptyped_{unique}", 1, retry={"tiers": ["200ms"], "max_attempts": 3})
    seen: list[str] = []
    async with declared(transport, redis, unique, spec):
        records = [Record(DEEP, b"k"), Record(b'{"conversation_id": "c2"}', b"k")]
        await produce(transport, spec.name, records)
        app = App([spec])

        @app.handler(spec.lane)
        async def handle(event: Said, ctx: Context) -> None:
            seen.append(event.conversation_id)

        member = await ran_until(
            app,
            transport,
            redis,
            unique,
            lambda m: m.stats.dead_lettered == 1 and seen == ["c2"],
            30,
        )
        assert member.stats.retried == 0
        dead = await the_dead_letter(transport, spec, unique)
        assert dead.headers[h.ERROR_CLASS] == b"pydantic_core._pydantic_core.ValidationError"
        assert b"recursion limit" in dead.headers[h.ERROR_MESSAGE]
        await transport.admin().delete_group(member.group, spec.topic_names())
