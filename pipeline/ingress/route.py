"""Lane routing at the door: the first rule that matches the payload picks the topic.

A rule looks at the values a JSON pointer finds (``*`` allowed) and matches when one of them
equals a value, is in a set, or (``exists``) when the pointer finds anything. No rule matching
means the source's default topic: "wrong for volume, right for correctness". Every topic a
router can pick is checked against ``topics/*.yaml`` at start, so a route never strands events
in a topic nothing consumes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pipeline.ingress.extract import resolve


@dataclass(frozen=True, slots=True)
class Condition:
    """Matches a payload when a value at ``pointer`` satisfies the test.

    Exactly one of ``equals``, ``one_of`` and ``exists`` is set.
    """

    pointer: tuple[str, ...]
    equals: Any = None
    one_of: frozenset[Any] | None = None
    exists: bool | None = None

    def matches(self, payload: Any) -> bool:
        """Whether ``payload`` satisfies the condition."""
        values = resolve(payload, self.pointer)
        if self.exists is not None:
            return any(True for _ in values) == self.exists
        if self.one_of is not None:
            return any(_hashable(value) and value in self.one_of for value in values)
        return any(value == self.equals for value in values)


@dataclass(frozen=True, slots=True)
class Route:
    """Where an event goes: its topic and that topic's admission lane."""

    topic: str
    lane: str


@dataclass(frozen=True, slots=True)
class RouteRules:
    """First matching rule wins, then the default route."""

    rules: Sequence[tuple[Condition, Route]]
    default: Route

    @property
    def needs_body(self) -> bool:
        """Whether routing reads the JSON body (any rule at all)."""
        return bool(self.rules)

    def route(self, payload: Any) -> Route:
        """The route of ``payload``."""
        for condition, route in self.rules:
            if condition.matches(payload):
                return route
        return self.default


def _hashable(value: Any) -> bool:
    return not isinstance(value, dict | list)
