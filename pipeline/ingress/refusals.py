"""The ingress's refusal lines: one INFO line each, alike ones backed off, what a request said cut.

Every refusal of the ingress (the app's 400, 401, 403, 404, 405, 408, 413; the door's 431,
414, 400, 408, 503) logs one INFO line through :class:`Refusals`. Lines are judged by a repeat
key (:func:`~pipeline.log_repeats.shown_now`), never by their text: a key names a source and a
reason, or one kind of refusal, so the keys are a bounded set whatever requests come (a flood
of random paths is one key, and nothing of each path is kept). What a request said that a line
shows (a path, a method) is cut and escaped first (:func:`quoted`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping

from pipeline.log_repeats import RepeatFilter, shown_now

__all__ = ["NAMES_CHARS", "NAME_CHARS", "Refusals", "listed", "quoted"]

NAME_CHARS = 64
"""Characters of a name a request sent (an unknown source, a method) shown in a line."""
NAMES_CHARS = 200
"""Characters of a list of configured names (the sources) shown in a line, about."""


class Refusals:
    """The INFO line of each refused request, alike ones backed off: a flood is a few lines.

    A :class:`~pipeline.log_repeats.RepeatFilter` lets anything below WARNING through, so each
    line is judged here first, as a warning alike to the others of its ``alike`` key (a source
    and its reason, or one kind of the door's refusals; numbers kept): the first is logged, then
    one after 1 s, 2 s, 4 s ... up to 60 s, saying how many like it were held back. Nothing is
    judged or formatted while the logger is not enabled for INFO (the default level is WARNING).
    """

    def __init__(self, repeats: RepeatFilter | None = None) -> None:
        """Back off alike lines with ``repeats`` (a filter of its own by default)."""
        self.repeats = RepeatFilter() if repeats is None else repeats
        """The filter that judges the lines (its table holds one entry per ``alike`` key)."""

    def log(
        self,
        logger: logging.Logger,
        alike: str,
        msg: str,
        *args: object,
        extra: Mapping[str, object] | None = None,
    ) -> None:
        """``logger.info(msg, *args)``, unless lines alike to ``alike`` hold it back.

        ``alike`` must come from a bounded set (a configured source's name and a fixed reason,
        a fixed kind): never from what a request sent.
        """
        if not logger.isEnabledFor(logging.INFO):
            return
        held = shown_now(self.repeats, logger, alike)  # " [N more like this ...]", or nothing
        if held is None:
            return
        held_too = f"{msg}%s"  # the caller's format, then the held-back count
        logger.info(held_too, *args, held, extra=extra, stacklevel=2)


def quoted(text: str, most: int = NAME_CHARS) -> str:
    """``text`` as Python writes a string (quotes, escapes), cut at ``most`` characters first.

    A cut one ends ``...`` after its closing quote: what a request sent may be any length and
    hold control characters, and a line shows neither.
    """
    if len(text) <= most:
        return repr(text)
    return f"{text[:most]!r}..."


def listed(names: Iterable[str], most: int = NAMES_CHARS) -> str:
    """``names`` sorted and joined with ``, ``, cut near ``most`` characters (``and N more``)."""
    ordered = sorted(names)
    shown: list[str] = []
    size = 0
    for name in ordered:
        part = quoted(name) if not name.isprintable() or len(name) > NAME_CHARS else name
        if shown and size + len(part) > most:
            break
        shown.append(part)
        size += len(part) + 2
    left = len(ordered) - len(shown)
    text = ", ".join(shown) if shown else "none"
    return f"{text} and {left} more" if left else text
