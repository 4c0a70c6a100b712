"""The canonical order in which every member takes a job's throttle keys.

Acquiring keys one by one and keeping the ones taken can deadlock unless every job takes them in
one global order: then a job only ever waits for a key later than all it holds, and the
waits-for graph has no cycle. Any fixed total order would do; this one takes the narrowest scope
first, so a job waiting on a key holds only narrower slots, which the jobs queued behind it
would need anyway (a job waiting for the shared ``pool`` does not keep an org slot from a sibling
that could run, and one waiting on its own sub-tenant holds no org slot at all).
"""

from __future__ import annotations

from collections.abc import Sequence

SCOPE_RANK = {"job": 0, "doc": 0, "sub": 1, "org": 2, "dep": 3, "pool": 4}
"""Rank of a key's scope (the text before its first ``:``): narrower scopes are taken first."""
_OTHER_RANK = 2


def canonical_order(keys: Sequence[str]) -> tuple[str, ...]:
    """``keys`` without duplicates, narrowest scope first (see ``SCOPE_RANK``), then by name."""
    return tuple(
        sorted(set(keys), key=lambda key: (SCOPE_RANK.get(key.split(":", 1)[0], _OTHER_RANK), key))
    )
