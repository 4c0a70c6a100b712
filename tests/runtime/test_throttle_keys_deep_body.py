"""A body nested too deep for ``json`` takes no throttle key from its fields; it stops nothing.

A throttled lane whose key template names a body field reads the body when the key, the lane
and ``pl-tenant`` do not fill it. ``json.loads`` of a body nested some ten thousand levels
deep raises ``RecursionError``, no ``ValueError``: it went up through the chain's ``enter``
into the member's poll loop and ended the member, and every member that read the message
after it, for as long as the partition held it.
"""

from __future__ import annotations

from runtime.guard_parts import Producer
from runtime.helpers import eventually, lane_spec, throttled_chain
from support import own_throttle

from pipeline.admission.throttle import Throttle
from pipeline.envelope import Message
from pipeline.runtime import App, Context
from pipeline.runtime.throttle_gate import throttle_keys

_DEEP = b"[" * 100_000 + b"]" * 100_000
"""A body of 200 kB, well within a message's size, nested past any recursion limit."""


throttle = own_throttle(default_limit=1)
"""A started throttle in a namespace of the test's own: one slot per tenant."""


async def test_a_deeply_nested_body_enters_and_runs(throttle: Throttle, unique: str) -> None:
    """It is admitted without the body field's key and handled; the next message runs too."""
    spec = lane_spec(
        f"deepbody_{unique}", 1, throttle={"keys": ["cust:{customer_id}", "org:{tenant}"]}
    )
    app = App([spec])
    ran: list[int] = []

    @app.handler(spec.lane)
    async def handle(event: bytes, ctx: Context) -> None:
        ran.append(ctx.message.offset)

    deep = Message(spec.name, 0, 0, b"k", _DEEP, {})
    assert spec.throttle is not None
    assert throttle_keys(spec.throttle, spec.lane, deep) == []
    async with throttled_chain(app, throttle, Producer(), max_concurrency=1) as parts:
        chain, settled = parts.chain, parts.settled
        chain.enter(deep)
        chain.enter(Message(spec.name, 0, 1, b"k", b'{"customer_id": "c1"}', {}))
        await eventually(lambda: len(settled) == 2, 30)
        assert settled == [(0, "handled"), (1, "handled")]
        assert ran == [0, 1]
