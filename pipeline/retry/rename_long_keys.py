"""Move parked keys' state from the names an earlier release gave long message keys.

A release before the key bound (``pipeline/redis_keys.py``) named a parked message key's state
(``T:z|h|f:K``, its field in ``T:parked`` and its entry in ``T:rel``) by the url-safe base64 of
the key whatever its size; this one names a key over 768 bytes (a base64 form over 1,024
characters) by ``#sha256:<hex>`` of the key (:func:`~pipeline.retry.keys.encode_key`). A member
of this release never finds state parked under the longer name: the key's held followers,
whose offsets are committed, would never run. :func:`rename_long_parked` moves such state to
its current name when ``pipeline consume`` starts, before it consumes.

Cost: one ``HSCAN`` pass of each lane's ``T:parked``, in pages of :data:`PAGE` fields; a page
with a field of the earlier long form adds one ``gd_rename`` call (``lua/rename.lua``), which
moves its keys atomically. Nothing else, and nothing per message. Idempotent, and safe with
members starting at once: a key is moved only while its earlier name is still parked and its
current one is not. A key parked under both (a member of this release parked it again while
one of the earlier release held it) is left as it is, with one warning.
"""

from __future__ import annotations

import base64
import binascii
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from redis.asyncio import Redis

from pipeline.redis_functions import FAILED
from pipeline.redis_keys import DIGEST_PREFIX, NAME_PART_MAX_BYTES
from pipeline.retry.keys import encode_key, guard_keys
from pipeline.retry.rename_functions import RenameFunctions

__all__ = ["PAGE", "Renamed", "current_name", "rename_lane", "rename_long_parked"]

log = logging.getLogger(__name__)

PAGE = 100
"""Fields of a lane's ``T:parked`` read by one ``HSCAN`` (and moved by one call at most)."""


@dataclass(slots=True)
class Renamed:
    """What one lane's pass found."""

    moved: int = 0
    both: list[str] = field(default_factory=list)
    """Current names of keys parked under both names (left as they are)."""


def current_name(name: str) -> str | None:
    """The current name of a key an earlier release parked as ``name``; None if unchanged.

    Only a canonical url-safe base64 form over :data:`~pipeline.redis_keys.NAME_PART_MAX_BYTES`
    characters (a key over 768 bytes) was named otherwise before; a digest form or anything
    that is no such base64 is left alone.
    """
    if len(name) <= NAME_PART_MAX_BYTES or name.startswith(DIGEST_PREFIX):
        return None
    try:
        raw = base64.b64decode(name, altchars=b"-_", validate=True)
    except (binascii.Error, ValueError):
        return None
    if base64.urlsafe_b64encode(raw).decode() != name:
        return None
    current = encode_key(raw)
    return None if current == name else current


def _text(raw: bytes | str) -> str | None:
    if isinstance(raw, str):
        return raw
    try:
        return raw.decode("ascii")
    except UnicodeDecodeError:
        return None  # no base64


def _pairs(fields: Iterable[bytes | str]) -> list[tuple[str, str]]:
    pairs = []
    for raw in fields:
        name = _text(raw)
        current = None if name is None else current_name(name)
        if name is not None and current is not None:
            pairs.append((name, current))
    return pairs


async def rename_lane(client: Redis, prefix: str, lane: str, *, page: int = PAGE) -> Renamed:
    """Move the keys ``lane`` parked under an earlier release's long names to their current ones.

    Raises redis errors: the caller decides what to say.
    """
    keys = guard_keys(prefix, lane)
    functions = RenameFunctions(client)
    out = Renamed()
    cursor = 0
    while True:
        cursor, fields = await client.hscan(keys.parked, cursor, count=page)
        pairs = _pairs(fields)
        if pairs:
            answers = await functions.rename(keys, pairs)
            out.moved += answers.count("moved")
            out.both += [
                new for (_, new), moved in zip(pairs, answers, strict=True) if moved == "both"
            ]
        if not cursor:
            return out


async def rename_long_parked(client: Redis, prefix: str, lanes: Sequence[str]) -> int:
    """Move what ``lanes`` parked under an earlier release's long names; how many keys moved.

    One INFO line a lane that moved any, one WARNING a key parked under both names; a Redis out
    of reach (or failing) ends the pass with one WARNING naming the lanes left (the start goes
    on: their keys wait for the next start).
    """
    total = 0
    for at, lane in enumerate(lanes):
        try:
            renamed = await rename_lane(client, prefix, lane)
        except FAILED as exc:  # out of reach: the other lanes' calls would wait as long
            log.warning(
                "could not move keys parked under an earlier release's names on lanes %s "
                "(Redis: %s): held followers of message keys over 768 bytes parked before the "
                "key bound wait until a member starts with Redis reachable",
                ", ".join(lanes[at:]),
                exc,
            )
            return total
        if renamed.moved:
            log.info(
                "moved %d parked keys of lane %s from an earlier release's names (message "
                "keys over 768 bytes, now named by their digest): their held followers run "
                "when their heads do",
                renamed.moved,
                lane,
            )
        for name in renamed.both:
            log.warning(
                "parked key %s of lane %s is parked under both its earlier name and its "
                "current one (a member of this release parked it again while one of the "
                "earlier release held it): both left as they are; the followers held under "
                "the earlier name wait until a member starts after the current one is released "
                "(restart one once pipeline status shows the lane without parked keys), which "
                "moves them",
                name,
                lane,
            )
        total += renamed.moved
    return total
