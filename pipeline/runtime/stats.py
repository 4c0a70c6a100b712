"""What a member counts about the messages it delivers (:attr:`Member.stats`)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Stats:
    """Counts of what happened to the messages this member delivered."""

    handled: int = 0
    skipped: int = 0
    retried: int = 0
    dead_lettered: int = 0
    expired: int = 0
    shed: int = 0
    budget_exhausted: int = 0
    already_done: int = 0
    parked: int = 0
    duplicates: int = 0
    busy_waits: int = 0
    """Times a start waited because another live member process still ran the same copy."""
    buffered: int = 0
    turns: int = 0
    turn_retries: int = 0
    deferred: int = 0
    cancelled: int = 0
    hung: int = 0
