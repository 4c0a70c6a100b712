"""What a member keeps per key, tenant, conversation or message: the entries of each structure.

A producer that sends every message with a new key, ``pl-tenant`` and conversation must leave
no entry behind once its messages are done. :func:`entries` counts, in an in-process
:class:`~pipeline.runtime.member.Member` (and the throttle it admits through), every structure
the runtime keys that way; the test of the flood (``test_unique_keys_memory.py``) and a
by-hand measurement of a ``pipeline consume`` process read it.
"""

from __future__ import annotations

from typing import Any

from pipeline.admission.fleet import FleetLimits
from pipeline.admission.throttle import Throttle
from pipeline.runtime.member import Member

PER_KEY = (
    "lanes.queues",
    "lanes.running",
    "gate.queues",
    "gate.acquiring",
    "gate.active",
    "gate.permits",
    "gate.waiting_by",
    "gate.background",
    "throttle.live",
    "throttle.waiting",
    "throttle.confirmed_at",
    "throttle.suspect",
    "throttle.background",
    "handler.deferring",
    "handler.calls",
    "guard.running",
    "guard.route_recorded",
    "guard.reaped",
    "claims.unsure",
    "turns.running",
    "fleet.submitted",
    "fleet.finished",
)
"""Structures that must be empty once every message is done and the member idles."""

BOUNDED = ("claims.maybe_parked",)
"""Structures that keep keys past their messages, up to a bound of their own."""


def entries(member: Member, throttle: Throttle | None, fleet: FleetLimits | None) -> dict[str, int]:
    """The number of entries of each per-key structure of ``member`` now."""
    m: Any = member
    chain, guard, handler = m._chain, m._guard, m._handler
    lanes, gate = chain.lanes, chain.gate
    out = {
        "lanes.queues": len(lanes._queues),
        "lanes.running": len(lanes._running),
        "lanes.ready": len(lanes._ready),
        "handler.deferring": len(handler.deferring),
        "handler.calls": len(handler._calls),
        "guard.running": len(guard._running),
        "guard.route_recorded": len(guard._route_recorded),
        "guard.reaped": len(guard._reaped),
        "guard.releasing": sum(len(keys) for keys in guard._releasing.values()),
        "claims.maybe_parked": sum(len(c.maybe_parked or ()) for c in guard._claims.values()),
        "claims.unsure": sum(len(c._unsure) for c in guard._claims.values()),
        "turns.running": 0 if m._turns is None else len(m._turns._running),
    }
    if gate is not None:
        out |= {
            "gate.queues": len(gate._queues),
            "gate.acquiring": len(gate._acquiring),
            "gate.active": len(gate._active),
            "gate.permits": len(gate._permits),
            "gate.waiting_by": len(gate.waiting_by),
            "gate.background": len(gate._background),
        }
    if throttle is not None:
        t: Any = throttle
        out |= {
            "throttle.live": len(t._live),
            "throttle.waiting": len(t._waiting),
            "throttle.confirmed_at": len(t._confirmed_at),
            "throttle.suspect": len(t._suspect),
            "throttle.background": len(t._background),
        }
    if fleet is not None:
        f: Any = fleet
        out |= {"fleet.submitted": len(f._submitted), "fleet.finished": len(f._finished)}
    return out


def member_ticks(member: Member) -> int:
    """The commit ticks ``member`` has run (a reap tick is one in ``_reap_every`` of them)."""
    ticks: int = getattr(member, "_ticks")  # noqa: B009 - the member's own count
    return ticks
