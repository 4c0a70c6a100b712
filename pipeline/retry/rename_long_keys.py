"""Keep the state of parked long message keys under the name every running member finds.

A release before the key bound (``pipeline/redis_keys.py``) named a parked message key's state
(``T:z|h|f:K``, its field in ``T:parked`` and its entry in ``T:rel``) by the url-safe base64 of
the key whatever its size; this one names a key over 768 bytes by ``#sha256:<hex>`` of the key
(:func:`~pipeline.retry.keys.encode_key`). A member of either release never finds state parked
under the other's name: the key's held followers, whose offsets are committed, would never
run. So:

- Every guard call of this release names such a key by both names and works on whichever is
  parked (``lua/guard.lua``, ``resolve``): whatever a member of the earlier release parked is
  found. It parks a key under its base64 name while a member of the earlier release is alive
  (``T:live``, :data:`~pipeline.retry.keys.DIGEST_MEMBER`), under its digest otherwise.
- :func:`rename_long_parked`, when ``pipeline consume`` starts, moves state parked under the
  earlier names to the digest names, unless a member of the earlier release is alive (a
  rolling update: that member would lose sight of it).
- :class:`LongKeyNames`, on the member's reap tick: while a member of the earlier release is
  alive, moves state parked under digest names (before it came: a rollback) to the base64
  names, which it can see; once none is, moves the base64 ones to their digests.

Cost: nothing per message for a key of up to 768 bytes (one length check); a longer one sends
both names. A pass is one ``HSCAN`` of the lane's ``T:parked`` matching only the names to move,
in pages bounded by bytes (:data:`PAGE_BYTES`: a base64 name of a 1 MiB key is 1.4 MB), and a
page with any adds one atomic call (``lua/rename.lua``). The tick runs a pass only after the
fleet changed (a member of the earlier release came or went) until one finds nothing left to
move. Idempotent, and safe with members moving at once: a key is moved only while its name is
still parked and its other one is not, and not while a release of it is in progress (its
member renews it under the name it has; the key moves once that is over). A key parked under
both names is left as it is, with one warning.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from redis.asyncio import Redis

from pipeline.redis_functions import FAILED
from pipeline.redis_keys import DIGEST_PREFIX, NAME_PART_MAX_BYTES
from pipeline.retry.keys import (
    GuardKeys,
    current_name,
    guard_keys,
    names_long_keys_by_digest,
)
from pipeline.retry.rename_functions import Moved, RenameFunctions

__all__ = [
    "PAGE",
    "PAGE_BYTES",
    "LongKeyNames",
    "Renamed",
    "current_name",
    "earlier_members",
    "rename_back_lane",
    "rename_lane",
    "rename_long_parked",
]

log = logging.getLogger(__name__)

PAGE = 100
"""Fields of a lane's ``T:parked`` read by one ``HSCAN`` at most (and moved by one call)."""
PAGE_BYTES = 8 << 20
"""About the most bytes of names one page reads: pages of long names hold fewer fields."""
_FIRST_PAGE = 4
"""Fields the first page of long names asks for, before their size is known."""
_LONG = "?" * (NAME_PART_MAX_BYTES + 1) + "*"
"""``HSCAN`` pattern of names over 1,024 characters (only such base64 names move)."""


@dataclass(slots=True)
class Renamed:
    """What one lane's pass found."""

    moved: int = 0
    both: list[str] = field(default_factory=list)
    """Names of keys parked under both names (left as they are)."""
    busy: int = 0
    """Keys left for now: a release of theirs is in progress."""
    unnamed: int = 0
    """Digest-named keys whose earlier name is not kept (parked by a build that kept none)."""

    def add(self, names: Sequence[str], answers: Sequence[Moved]) -> None:
        """Count one call's answers (``names``: the name each key had)."""
        self.moved += answers.count("moved")
        self.busy += answers.count("busy")
        self.unnamed += answers.count("unnamed")
        self.both += [name for name, moved in zip(names, answers, strict=True) if moved == "both"]


def _text(raw: bytes | str) -> str | None:
    if isinstance(raw, str):
        return raw
    try:
        return raw.decode("ascii")
    except UnicodeDecodeError:
        return None  # no base64, no digest


def _pairs(fields: Iterable[bytes | str]) -> list[tuple[str, str]]:
    pairs = []
    for raw in fields:
        name = _text(raw)
        current = None if name is None else current_name(name)
        if name is not None and current is not None:
            pairs.append((name, current))
    return pairs


async def earlier_members(client: Redis, keys: GuardKeys) -> int:
    """How many member processes of the release before the key bound are alive on the lane."""
    until = await client.hgetall(keys.live)
    seconds, micros = await client.time()
    now_ms = int(seconds) * 1000 + int(micros) // 1000
    return sum(
        1
        for instance, live in until.items()
        if int(live) > now_ms and not names_long_keys_by_digest(_text(instance) or "")
    )


async def rename_lane(client: Redis, prefix: str, lane: str, *, page: int = PAGE) -> Renamed:
    """Move the keys ``lane`` parked under an earlier release's long names to their current ones.

    Pages hold about :data:`PAGE_BYTES` of names, ``page`` fields at most. Raises redis errors:
    the caller decides what to say.
    """
    keys = guard_keys(prefix, lane)
    functions = RenameFunctions(client)
    out = Renamed()
    cursor, count = 0, min(page, _FIRST_PAGE)
    while True:
        cursor, fields = await client.hscan(keys.parked, cursor, match=_LONG, count=count)
        pairs = _pairs(fields)
        if pairs:
            out.add([new for _, new in pairs], await functions.rename(keys, pairs))
        longest = max((len(name) for name in fields), default=0)
        count = max(1, min(page, PAGE_BYTES // longest)) if longest else min(page, 2 * count)
        if not cursor:
            return out


async def rename_back_lane(client: Redis, prefix: str, lane: str, *, page: int = PAGE) -> Renamed:
    """Move the keys ``lane`` parked under digest names to the earlier names they keep.

    For a member of the release before the key bound, which finds only those. Raises redis
    errors: the caller decides what to say.
    """
    keys = guard_keys(prefix, lane)
    functions = RenameFunctions(client)
    out = Renamed()
    cursor = 0
    while True:
        cursor, fields = await client.hscan(
            keys.parked, cursor, match=f"{DIGEST_PREFIX}*", count=page
        )
        names = [name for name in (_text(raw) for raw in fields) if name is not None]
        if names:
            out.add(names, await functions.rename_back(keys, names))
        if not cursor:
            return out


def _warn_both(renamed: Renamed, lane: str) -> None:
    for name in renamed.both:
        log.warning(
            "parked key %s of lane %s is parked under both its digest name and its earlier "
            "(base64) one (a member of each release parked it while the other held it): both "
            "left as they are; the followers held under the name a member does not find wait "
            "until the other is released (moved by the reap tick then)",
            name[:80],
            lane,
        )


async def rename_long_parked(client: Redis, prefix: str, lanes: Sequence[str]) -> int:
    """Move what ``lanes`` parked under an earlier release's long names; how many keys moved.

    Not on a lane where a member of that release is alive (a rolling update): it finds only
    those names, and this release's members find both (:class:`LongKeyNames` moves them once
    it stopped). One INFO line a lane that moved any, or was left for that reason, one WARNING
    a key parked under both names; a Redis out of reach (or failing) ends the pass with one
    WARNING naming the lanes left (the start goes on: the reap tick moves their keys).
    """
    total = 0
    for at, lane in enumerate(lanes):
        try:
            earlier = await earlier_members(client, guard_keys(prefix, lane))
            renamed = Renamed() if earlier else await rename_lane(client, prefix, lane)
        except FAILED as exc:  # out of reach: the other lanes' calls would wait as long
            log.warning(
                "could not move keys parked under an earlier release's names on lanes %s "
                "(Redis: %s): members of this release find them under either name, and the "
                "reap tick moves them once Redis answers",
                ", ".join(lanes[at:]),
                exc,
            )
            return total
        if earlier:
            log.info(
                "lane %s: %d members of the release before the key bound run (a rolling "
                "update): message keys over 768 bytes stay parked under their base64 names, "
                "which those members find, until the last of them stops",
                lane,
                earlier,
            )
        if renamed.moved:
            log.info(
                "moved %d parked keys of lane %s from an earlier release's names (message "
                "keys over 768 bytes, now named by their digest): their held followers run "
                "when their heads do",
                renamed.moved,
                lane,
            )
        _warn_both(renamed, lane)
        total += renamed.moved
    return total


class LongKeyNames:
    """Moves one lane's parked long keys to the name every running member finds (reap tick).

    :meth:`tick` is told whether a member of the release before the key bound is alive. After
    that changes (and at first), a pass runs every tick until one leaves nothing it can move:
    to the base64 names while such a member is alive (keys parked under digests before it came,
    a rollback), to the digests once none is.
    """

    def __init__(self, client: Redis, prefix: str, lane: str) -> None:
        """Keep the long keys of ``lane`` under ``prefix`` through ``client``."""
        self._client = client
        self._prefix = prefix
        self.lane = lane
        self._earlier: bool | None = None
        self._pending = True

    async def tick(self, earlier_live: bool) -> None:
        """One pass if one is due (Redis errors: one WARNING; the next tick tries again)."""
        if earlier_live != self._earlier:
            self._earlier, self._pending = earlier_live, True
        if not self._pending:
            return
        try:
            if earlier_live:
                renamed = await rename_back_lane(self._client, self._prefix, self.lane)
            else:
                renamed = await rename_lane(self._client, self._prefix, self.lane)
        except FAILED as exc:
            log.warning(
                "could not move parked keys of lane %s to the names every member finds "
                "(Redis: %s): the next reap tick tries again",
                self.lane,
                exc,
            )
            return
        self._pending = bool(renamed.busy)
        if renamed.moved:
            log.info(
                "moved %d parked keys of lane %s to their %s names (message keys over 768 "
                "bytes), which every member running now finds",
                renamed.moved,
                self.lane,
                "base64" if earlier_live else "digest",
            )
        if renamed.unnamed:
            log.warning(
                "%d parked keys of lane %s are named by their digest with no earlier name "
                "kept (parked by a build before this one): a member of the release before the "
                "key bound does not find them; their held followers run only through a member "
                "of this release",
                renamed.unnamed,
                self.lane,
            )
        _warn_both(renamed, self.lane)
