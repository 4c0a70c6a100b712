"""Which event annotations name a body the runtime reads as a JSON object or as text.

One rule for the runtime, which decodes such a body (:func:`pipeline.runtime.app.body_adapter`),
and the AsyncAPI export, which describes it (:func:`pipeline.topics.asyncapi.model_of`): a
``dict`` (``dict[str, Any]``, ``Mapping[str, Any]``, bare or with ``object`` for ``Any``) is a
JSON object, ``str`` is UTF-8 text; anything else (``dict[str, int]``, ``dict | None``) is
neither.
"""

from __future__ import annotations

import typing
from collections.abc import Mapping
from typing import Any, Literal

BodyKind = Literal["object", "text"]


def body_kind(kind: Any) -> BodyKind | None:
    """``object`` for a JSON-object annotation, ``text`` for ``str``, None for any other."""
    if kind is str:
        return "text"
    shape = typing.get_origin(kind) or kind
    if shape in (dict, Mapping) and typing.get_args(kind) in ((), (str, Any), (str, object)):
        return "object"
    return None
