"""The live terminal dashboard (rich): waits per tenant, counts, debounced turns."""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from demo.stats import SMALL, Waits
from demo.summary import Snapshot
from demo.traffic import FLOODER, traffic_stage

LEGEND = (
    "in retry: events waiting for a later attempt in a retry tier, mostly the flooder's"
    " deferred by its tenant budget (not lost; the summary counts them). waiting: not yet"
    " consumed from a main topic."
)
"""The line under the flow table that says what its last two columns hold."""


def phase(snapshot: Snapshot) -> str:
    """The run's phase, with the flood's stage (calm, flood, after flood) during the traffic."""
    if snapshot.phase != "traffic":
        return snapshot.phase
    return f"{snapshot.phase}: {traffic_stage(snapshot.duration_s, snapshot.elapsed_s)}"


def _ms(value: int | None) -> str:
    return "-" if value is None else f"{value:,}"


def _wait_row(table: Table, name: str, waits: Waits, style: str | None = None) -> None:
    table.add_row(name, f"{waits.count:,}", _ms(waits.p(0.5)), _ms(waits.p(0.99)), style=style)


def progress_line(s: Snapshot) -> str:
    """The line a headless run prints every few seconds (``n/a`` for a wait not measured yet)."""
    c = s.collector
    sep = ", " if s.phase == "traffic" else ": "  # "traffic: flood, accepted", "draining: ..."
    return (
        f"{s.elapsed_s:6.1f}s {phase(s)}{sep}accepted {s.accepted}, handled {s.handled}, "
        f"dead {s.dead_lettered}, in retry {s.waiting_retry}, "
        f"small p99 {_ms_or_na(c.small.p(0.99))}, flooder p99 {_ms_or_na(c.flooder().p(0.99))}, "
        f"turns {c.turns}"
    )


def _ms_or_na(value: int | None) -> str:
    return "n/a" if value is None else f"{value} ms"


def render(snapshot: Snapshot) -> RenderableType:
    """One frame of the dashboard."""
    c = snapshot.collector
    shown = phase(snapshot)
    head = Text.assemble(
        ("pipeline demo", "bold"),
        f"  {snapshot.transport}  ",
        (shown, "bold red" if shown.endswith(": flood") else ""),
        "  ",
        f"{snapshot.elapsed_s:5.1f}s / {snapshot.duration_s:.0f}s",
        ("  (interrupted)" if snapshot.interrupted else "", "yellow"),
    )
    t = snapshot.traffic
    flow = Table(
        "sent", "accepted", "503 shed", "handled", "retries", "dead letters", "in retry", "waiting"
    )
    flow.add_row(
        f"{t.get('sent', 0):,}",
        f"{snapshot.accepted:,}",
        f"{t.get('shed', 0):,}",
        f"{snapshot.handled:,}",
        f"{c.outcomes['retry']:,}",
        f"{snapshot.dead_lettered:,}",
        f"{snapshot.waiting_retry:,}",
        f"{snapshot.waiting:,}",
        style=None,
    )
    waits = Table("tenant", "events", "p50 wait ms", "p99 wait ms", title="wait before the handler")
    _wait_row(waits, f"{FLOODER} (flooder)", c.flooder(), "red")
    for name, tenant_waits in c.top_tenants():
        _wait_row(waits, name, tenant_waits)
    _wait_row(waits, SMALL, c.small, "bold green")
    turns = Table(
        "AI messages",
        "turns",
        "messages/turn",
        "p50 turn wait ms",
        "p99 turn wait ms",
        title="debounced AI turns",
    )
    per_turn = c.messages_per_turn
    turns.add_row(
        f"{t.get('by_kind', {}).get('ai', 0):,}",
        f"{c.turns:,}",
        "-" if per_turn is None else f"{per_turn:.2f}",
        _ms(c.turn_waits.p(0.5)),
        _ms(c.turn_waits.p(0.99)),
    )
    legend = Text(LEGEND, style="dim")
    return Group(head, flow, legend, waits, turns)
