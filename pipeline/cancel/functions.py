"""The Redis Functions library ``lua/cancel.lua`` and typed wrappers around its functions.

Loaded once per client under its versioned name (:mod:`pipeline.redis_functions`); a call that
finds it missing reloads it and retries once.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources

from redis.asyncio import Redis

from pipeline.cancel.keys import CancelKeys
from pipeline.redis_functions import FunctionLibrary

LIBRARY = resources.files("pipeline.cancel").joinpath("lua/cancel.lua").read_text()


def _text(raw: bytes | str) -> str:
    return raw.decode() if isinstance(raw, bytes) else raw


@dataclass(slots=True)
class SyncBatch:
    """What a member tells Redis about its long work on one tick (see :meth:`sync`)."""

    begun: dict[str, str] = field(default_factory=dict)
    """Run id -> its JSON record, for runs started since the last tick."""
    ended: list[str] = field(default_factory=list)
    """Runs that finished since the last tick."""
    ages: dict[str, int] = field(default_factory=dict)
    """Run id -> how many ms ago its latest heartbeat was, by the member's monotonic clock:
    Redis records the heartbeat at its own time less that, so no host's clock is written."""
    beats: dict[str, int] = field(default_factory=dict)
    """Run id -> ms of its latest heartbeat on the clock of the call's ``now_ms``, which must
    then be given (a moment replayed, in tests); members send :attr:`ages`."""
    counts: dict[str, int] = field(default_factory=dict)
    """``lane:cancelled`` / ``lane:hung`` -> how many more since the last tick."""


class CancelFunctions(FunctionLibrary):
    """Calls into the ``pipeline_cancel`` library for one Redis client and key prefix."""

    def __init__(self, client: Redis, prefix: str) -> None:
        """Bind to ``client``; the library is loaded on first use."""
        super().__init__(client, LIBRARY)
        self.keys = CancelKeys(prefix)
        self._held: tuple[int, dict[str, dict[str, object]]] | None = None
        self.entries_read = 0
        """How many selector entries :meth:`selectors` has read from Redis, in all."""

    async def cancel(
        self, kind: str, lane: str, value: str, reason: str, now_ms: int, keep_ms: int
    ) -> tuple[int, int]:
        """``cn_cancel``: the transition; returns (new version, registered runs told to stop).

        ``now_ms`` 0 is the Redis server's time. ``keep_ms`` (positive, at most 2**62) goes as
        its digits and is added to the time exactly: a Lua number past 2**53 is a float.
        """
        k = self.keys
        version, marked = await self.fcall(
            "cn_cancel",
            [k.selectors, k.version, k.runs, k.stops, k.until, k.changes, k.meta],
            [kind, lane, value, reason, now_ms, str(keep_ms)],
        )
        return int(version), int(marked)

    async def sync(
        self, now_ms: int, batch: SyncBatch, running: Sequence[str]
    ) -> tuple[int, dict[str, str]]:
        """``cn_sync``: record ``batch``; returns (version, runs of ``running`` told to stop).

        ``now_ms`` 0 is the Redis server's time: runs begun are registered, and heartbeats
        recorded, by Redis's clock, which every member judges them by. The runs told to stop
        come as run id -> reason.

        Raises:
            ValueError: ``batch.beats`` given with ``now_ms`` 0 (they need their clock).
        """
        k = self.keys
        ages = dict(batch.ages)
        if batch.beats:
            if not now_ms:
                raise ValueError("heartbeat times need the now_ms of their clock; send ages")
            ages.update({ident: now_ms - beat_ms for ident, beat_ms in batch.beats.items()})
        args: list[str | int] = [now_ms, len(batch.begun)]
        for ident, record in batch.begun.items():
            args += [ident, record]
        args.append(len(batch.ended))
        args += batch.ended
        args.append(len(ages))
        for ident, age_ms in ages.items():
            args += [ident, age_ms]
        args.append(len(batch.counts))
        for name, count in batch.counts.items():
            args += [name, count]
        args += list(running)
        version, stopping = await self.fcall(
            "cn_sync", [k.runs, k.beats, k.stops, k.version, k.counts], args
        )
        pairs = [_text(x) for x in stopping]
        return int(version), dict(zip(pairs[::2], pairs[1::2], strict=True))

    async def settle(self, now_ms: int, timeout_ms: int, ident: str) -> str:
        """``cn_settle``: re-check one candidate and stop it if it still must stop.

        ``now_ms`` 0 is the Redis server's time, the clock the heartbeats are recorded by.
        Returns ``alive`` (a heartbeat landed in time), ``gone`` (it ended), ``stopping``
        (already told), ``dropped`` (its member is gone) or the reason it was told to stop.
        """
        k = self.keys
        return _text(
            await self.fcall(
                "cn_settle",
                [k.selectors, k.version, k.runs, k.stops, k.beats, k.meta],
                [now_ms, timeout_ms, ident],
            )
        )

    async def selectors(self) -> tuple[int, dict[str, dict[str, object]]]:
        """The version and every standing selector (``kind:lane:value`` -> at, reason, until).

        The first call reads them all; later ones read only the selectors set or removed since
        the version the previous call returned (``cn_read``), and all of them again only when
        Redis no longer keeps those changes. The map returned is the one later calls update in
        place.
        """
        if self._held is not None:
            version, entries = self._held
            k = self.keys
            reply = await self.fcall(
                "cn_read", [k.selectors, k.version, k.changes, k.meta], [version]
            )
            if int(reply[1]):
                pairs = reply[2:]
                for raw_field, raw in zip(pairs[::2], pairs[1::2], strict=True):
                    if raw:
                        entries[_text(raw_field)] = json.loads(raw)
                    else:
                        entries.pop(_text(raw_field), None)
                self.entries_read += len(pairs) // 2
                self._held = (int(reply[0]), entries)
                return self._held
        pipe = self.client.pipeline(transaction=False)
        pipe.get(self.keys.version)  # before the entries: they are at least as new as it says
        pipe.hgetall(self.keys.selectors)
        raw_version, raw_entries = await pipe.execute()
        every: Mapping[bytes, bytes] = raw_entries
        self.entries_read += len(every)
        self._held = (int(raw_version or 0), {_text(f): json.loads(v) for f, v in every.items()})
        return self._held
