"""A partition paused full spills its flood's waiting keys only where the lane parks them.

The spill keeps per-key order by parking: the key's first message is deferred through the
first retry tier, its key parked, and the rest held behind it in Redis by the run guard. A
member without the guard's Redis (``Member(..., throttle=...)`` with no ``redis``) parks
nothing: each spilled message went through the tier on its own, and the key's messages read
after the spill ran before the copies came back.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict

from runtime.helpers import FAST, declare, eventually, lane_spec, produce, running
from support import own_throttle

from pipeline import headers as h
from pipeline.admission.throttle import Throttle
from pipeline.config import RuntimeSettings
from pipeline.envelope import Message, Record
from pipeline.runtime import App, Context
from pipeline.runtime.member import Member
from pipeline.transport.protocol import Transport

throttle = own_throttle(default_limit=1)
"""A started throttle in a namespace of the test's own: one slot per tenant."""


async def test_a_member_that_parks_nothing_keeps_each_key_in_order(
    transport: Transport, throttle: Throttle, unique: str
) -> None:
    """Acme's 80 messages on 2 keys fill a 20-message buffer; no guard Redis: no spill."""
    await _flood_in_order(transport, throttle, unique, wire=False)


async def test_a_chain_told_that_nothing_parks_keeps_each_key_in_order(
    transport: Transport, throttle: Throttle, unique: str
) -> None:
    """The same, the chain told which lanes park as the member should tell it."""
    await _flood_in_order(transport, throttle, unique, wire=True)


async def _flood_in_order(
    transport: Transport, throttle: Throttle, unique: str, *, wire: bool
) -> None:
    spec = lane_spec(
        f"spillnopark_{unique}",
        1,
        retry={"tiers": ["200ms"]},
        throttle={"keys": ["org:{tenant}"]},
    )
    await declare(transport, spec)
    app = App([spec])
    by_key: dict[bytes, list[int]] = defaultdict(list)

    @app.handler(spec.lane)
    async def handle(event: Message, ctx: Context) -> None:
        await asyncio.sleep(0.01)
        by_key[event.key or b""].append(int(event.value.split(b":")[1]))

    records = [Record(b"acme:%d" % n, b"a%d" % (n % 2), {h.TENANT: b"acme"}) for n in range(80)]
    await produce(transport, spec.name, records)
    settings = FAST.model_copy(update={"partition_high_water": 20, "partition_low_water": 10})
    assert isinstance(settings, RuntimeSettings)
    member = Member(app, transport, f"g-{unique}", settings, throttle=throttle)
    if wire:
        member._chain._parks = member._parking.__contains__
    async with running(member):
        await eventually(lambda: sum(len(v) for v in by_key.values()) >= 80)
    for key in (b"a0", b"a1"):
        assert by_key[key] == sorted(by_key[key]), key
        assert len(by_key[key]) == 40, key
