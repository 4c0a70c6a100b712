"""Reading tenant, key, event id and routing values out of a request.

Values come from a JSON pointer into the body (RFC 6901, plus ``*`` matching every element of
an array or every value of an object, so ``/entry/*/changes/*/field`` looks into each change of
a Meta payload), from a request header, or from a constant.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

WILDCARD = "*"


def parse_pointer(text: str) -> tuple[str, ...]:
    """Split a JSON pointer into unescaped reference tokens.

    Raises:
        ValueError: the pointer is not empty and does not start with ``/``.
    """
    if text == "":
        return ()
    if not text.startswith("/"):
        raise ValueError(f"a JSON pointer starts with '/' (got {text!r})")
    return tuple(token.replace("~1", "/").replace("~0", "~") for token in text[1:].split("/"))


def resolve(document: Any, tokens: tuple[str, ...]) -> Iterator[Any]:
    """Every value ``tokens`` points at in ``document`` (several only through ``*``)."""
    if WILDCARD not in tokens:  # the common case, without a generator per level
        found = _walk(document, tokens)
        if found is not _MISSING:
            yield found
        return
    if not tokens:
        yield document
        return
    head, rest = tokens[0], tokens[1:]
    if head == WILDCARD:
        children = document.values() if isinstance(document, dict) else document
        if isinstance(document, dict | list):
            for value in children:
                yield from resolve(value, rest)
        return
    found = _walk(document, (head,))
    if found is not _MISSING:
        yield from resolve(found, rest)


_MISSING = object()


def _walk(document: Any, tokens: tuple[str, ...]) -> Any:
    for token in tokens:
        if isinstance(document, dict):
            if token not in document:
                return _MISSING
            document = document[token]
        elif isinstance(document, list) and token.isdigit() and int(token) < len(document):
            document = document[int(token)]
        else:
            return _MISSING
    return document


def as_text(value: Any) -> str:
    """A JSON value as an id string: strings as they are, anything else as compact JSON."""
    if isinstance(value, str):
        return value
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


@dataclass(frozen=True, slots=True)
class Extractor:
    """Reads one value: from ``pointer`` into the body, else a header, else ``constant``.

    A header value comes from ``header``, or from ``fallback`` when the request lacks it.
    """

    pointer: tuple[str, ...] | None = None
    header: str | None = None
    constant: str | None = None
    fallback: str | None = None

    @property
    def needs_body(self) -> bool:
        """Whether the value comes from the JSON body."""
        return self.pointer is not None

    def extract(self, payload: Any, headers: Mapping[str, str]) -> str | None:
        """The value, or None when the request does not have it."""
        if self.pointer is not None:
            if WILDCARD not in self.pointer:  # one value at most: no generator per request
                found = _walk(payload, self.pointer)
                return None if found is _MISSING or found is None else as_text(found)
            for value in resolve(payload, self.pointer):
                if value is not None:
                    return as_text(value)
            return None
        if self.header is not None:
            found = headers.get(self.header)
            if found is None and self.fallback is not None:
                return headers.get(self.fallback)
            return found
        return self.constant
