"""Every Redis key of cancellation and long work, in one place.

All of them share the hash tag ``{P:cancel}``, so each call of ``lua/cancel.lua`` touches one
Redis Cluster slot; the Lua file's header says what each key holds.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class CancelKeys:
    """The cancellation keys under one key prefix."""

    prefix: str

    @property
    def tag(self) -> str:
        """The hash tag every key starts with."""
        return f"{{{self.prefix}:cancel}}"

    @property
    def selectors(self) -> str:
        """Standing cancellations: ``kind:lane:value`` -> JSON (at, reason, until)."""
        return f"{self.tag}:sel"

    @property
    def until(self) -> str:
        """The selectors' end times (field -> until ms), so pruning reads only expired ones."""
        return f"{self.tag}:until"

    @property
    def version(self) -> str:
        """Bumped by every transition, so members know when to reread the selectors."""
        return f"{self.tag}:ver"

    @property
    def changes(self) -> str:
        """Selector field -> the version that last set or removed it: what members reread."""
        return f"{self.tag}:changes"

    @property
    def meta(self) -> str:
        """The change log's bounds (``floor``, ``logged``) and the index's progress."""
        return f"{self.tag}:meta"

    @property
    def runs(self) -> str:
        """Registered long work: run id -> JSON (lane, member, event, key, tenant, ...)."""
        return f"{self.tag}:runs"

    @property
    def beats(self) -> str:
        """Run id -> ms of its last heartbeat."""
        return f"{self.tag}:beats"

    @property
    def stops(self) -> str:
        """Run id -> the reason it was told to stop (its member stops it and clears this)."""
        return f"{self.tag}:stop"

    @property
    def counts(self) -> str:
        """``lane:cancelled`` and ``lane:hung`` -> how many, since the keys were created."""
        return f"{self.tag}:counts"

    def all(self) -> list[str]:
        """Every key, for tests and clean-up."""
        return [
            self.selectors,
            self.until,
            self.version,
            self.changes,
            self.meta,
            self.runs,
            self.beats,
            self.stops,
            self.counts,
        ]
