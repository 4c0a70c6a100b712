"""A redriven dead letter without an event id is the same event to ``ctx.once`` as its first run.

Without a ``pl-event-id`` the guard names an event by where it was first delivered; the dead
letter carries that position in its origin headers, which a redrive removes (on a main topic
only the router may write them). The redrive gives the message that position as its event id,
so its handler's once record is the one the first run wrote.
"""

from __future__ import annotations

import pytest
from redis.asyncio import Redis
from redrive.helpers import dead_letter_lane
from runtime.helpers import FAST, declare, eventually, lane_spec, produce, running

from pipeline import headers as h
from pipeline.cli.commands import _print_redrive
from pipeline.envelope import Message, Record
from pipeline.errors import DeadLetter
from pipeline.redrive.redrive import Redrive, Report, redriven
from pipeline.redrive.select import Selection
from pipeline.runtime import App, Context
from pipeline.runtime.member import Member
from pipeline.transport.protocol import Transport


async def test_a_redriven_dead_letter_without_event_id_does_not_run_its_effect_again(
    transport: Transport, redis: Redis, unique: str
) -> None:
    """Charged, then dead-lettered, then redriven and handled: charged once."""
    spec = lane_spec(f"rdonce_{unique}", 1)
    await declare(transport, spec)
    app = App([spec])
    charges: list[bytes] = []
    handled: list[int] = []

    async def charge() -> None:
        charges.append(b"charged")

    @app.handler(spec.lane)
    async def handle(event: bytes, ctx: Context) -> None:
        await ctx.once("charge", charge)
        handled.append(h.int_header(ctx.message.headers, h.REDRIVE_COUNT))
        if len(handled) == 1:
            raise DeadLetter("the receipt service refused it")

    await produce(transport, spec.name, [Record(b"order", b"k")])  # no pl-event-id
    member = Member(app, transport, f"g-{unique}", FAST, redis=redis, redis_prefix=f"t{unique}")
    async with running(member):
        await eventually(lambda: member.stats.dead_lettered == 1)
        report = await Redrive(transport, spec.dead_letter, Selection()).run()
        assert report.moved == 1
        await eventually(lambda: len(handled) == 2)
    assert handled == [0, 1]
    assert charges == [b"charged"], "the redriven dead letter ran its ctx.once effect again"


def test_the_redriven_message_is_named_by_its_first_delivery() -> None:
    """Its event id is its origin position; one the dead letter had is kept as it was."""
    origin = {h.ORIGIN_TOPIC: b"pay", h.ORIGIN_PARTITION: b"2", h.ORIGIN_OFFSET: b"41"}
    dead = Message("pay.dlq", 0, 7, b"k", b"v", dict(origin))
    assert (redriven(dead, "pay.dlq").headers or {})[h.EVENT_ID] == b"pay:2:41"
    named = Message("pay.dlq", 0, 8, b"k", b"v", {**origin, h.EVENT_ID: b"evt-9"})
    assert (redriven(named, "pay.dlq").headers or {})[h.EVENT_ID] == b"evt-9"


@pytest.mark.parametrize(
    "origin",
    [
        {},
        {h.ORIGIN_PARTITION: b"2", h.ORIGIN_OFFSET: b"41"},
        {h.ORIGIN_TOPIC: b"pay", h.ORIGIN_OFFSET: b"41"},
        {h.ORIGIN_TOPIC: b"pay", h.ORIGIN_PARTITION: b"two", h.ORIGIN_OFFSET: b"41"},
        {h.ORIGIN_TOPIC: b"pay", h.ORIGIN_PARTITION: b"2", h.ORIGIN_OFFSET: b"-1"},
    ],
)
def test_a_dead_letter_without_a_whole_origin_gets_no_event_id(origin: dict[str, bytes]) -> None:
    """Without topic, partition and offset (decimal) there is nothing to name it by."""
    dead = Message("pay.dlq", 0, 7, b"k", b"v", origin)
    assert h.EVENT_ID not in (redriven(dead, "pay.dlq").headers or {})


async def test_a_redrive_counts_the_dead_letters_once_cannot_recognise(
    transport: Transport, unique: str
) -> None:
    """Hand-made dead letters without event id or origin position are counted, dry or not."""
    _, dlq, headers = await dead_letter_lane(transport, unique, 1)
    await produce(
        transport,
        dlq,
        [
            Record(b"a", b"k1", headers),
            Record(b"b", b"k2", {**headers, h.EVENT_ID: b"evt-2"}),
            Record(b"c", b"k3", {**headers, h.ORIGIN_PARTITION: b"0", h.ORIGIN_OFFSET: b"5"}),
        ],
    )
    dry = await Redrive(transport, dlq, Selection(), dry_run=True).run()
    report = await Redrive(transport, dlq, Selection()).run()
    assert (dry.unidentified, report.moved, report.unidentified) == (1, 3, 1)


def test_the_redrive_command_says_how_many_once_cannot_recognise(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Its summary names the dead letters moved without an identity, and what that costs."""
    _print_redrive(Report(scanned=3, selected=3, moved=3, unidentified=2), dry_run=False)
    assert "2 without pl-event-id or origin position: ctx.once" in capsys.readouterr().out
    _print_redrive(Report(scanned=3, selected=3, moved=3), dry_run=False)
    assert "ctx.once" not in capsys.readouterr().out
