"""What ``pipeline status`` shows of cancellation: cancelled and hung counts per lane.

Members add to ``T:counts`` in Redis (``lua/cancel.lua``) each time they skip or stop work of a
lane because it was cancelled, and each time a run of the lane was hung; the counts are
fleet-wide and kept until the key is deleted.
"""

from __future__ import annotations

from collections.abc import Mapping

from redis import exceptions as rexc
from redis.asyncio import Redis
from rich.console import Console
from rich.markup import escape

from pipeline.cancel.keys import CancelKeys

KINDS = ("cancelled", "hung")


async def read_counts(redis: Redis, prefix: str) -> dict[str, dict[str, int]] | None:
    """Lane -> {cancelled, hung}; None when Redis cannot be read."""
    try:
        raw = await redis.hgetall(CancelKeys(prefix).counts)
    except (rexc.RedisError, OSError):
        return None
    counts: dict[str, dict[str, int]] = {}
    for name, value in raw.items():
        text = name.decode() if isinstance(name, bytes) else name
        lane, _, kind = text.rpartition(":")
        if kind in KINDS:
            counts.setdefault(lane, dict.fromkeys(KINDS, 0))[kind] = int(value)
    return counts


def render_counts(counts: Mapping[str, Mapping[str, int]] | None, console: Console) -> None:
    """One line: each lane with cancelled or hung work, hung ones in red."""
    if counts is None:
        console.print("cancelled / hung: [yellow]unavailable[/yellow] (Redis)", highlight=False)
        return
    parts = []
    for lane, kinds in sorted(counts.items()):
        hung = kinds.get("hung", 0)
        shown = f"[red]{hung}[/red]" if hung else "0"
        parts.append(f"{escape(lane)} cancelled {kinds.get('cancelled', 0)}, hung {shown}")
    console.print(
        f"cancelled / hung: {'; '.join(parts) or 'none'}",
        highlight=False,
        soft_wrap=True,
        emoji=False,
    )
