"""How a pydantic validation error's location reads in the project's one-line messages.

The topic declarations (:mod:`pipeline.topics.spec`) and the sources file
(:mod:`pipeline.ingress.settings`) both name the field at fault as a path such as
``retry.tiers[1]`` or ``sources.github.routes[0].topic``, in front of the file name.
"""

from __future__ import annotations

from collections.abc import Sequence


def field_path(loc: Sequence[int | str]) -> str:
    """A pydantic error location as a path: ``("retry", "tiers", 1)`` -> ``retry.tiers[1]``."""
    path = ""
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else f".{part}" if path else part
    return path
