"""A debounce key the runtime reads from a model (an attribute read) is not refused.

``turns.key_value`` reads ``getattr(event, key)``: a field, a computed field, a property, a
``functools.cached_property``, or an extra of a model that keeps extras all answer; an alias
does not (it is refused naming the field). A turn of bytes has no model: no key check.
"""

from __future__ import annotations

import functools
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict, Field

from pipeline.envelope import Message
from pipeline.errors import ConfigError
from pipeline.runtime import App, Context
from pipeline.runtime.turns import key_value
from pipeline.topics.spec import TopicSpec

LANE = "notes"


class Cached(BaseModel):
    """The conversation is a cached property of the event."""

    uid: str

    @functools.cached_property
    def user_id(self) -> str:
        """The user, read once."""
        return self.uid.lower()


class Aliased(BaseModel):
    """A field with a JSON alias, populated by either name."""

    model_config = ConfigDict(populate_by_name=True)

    user_id: str = Field(alias="userId")


def notes_app(key: str) -> App:
    """An App of the debounced lane ``notes`` keyed on ``key``."""
    return App(
        [
            TopicSpec.model_validate(
                {
                    "name": LANE,
                    "partitions": 1,
                    "debounce": {"key": key, "quiet_s": 4, "max_wait_s": 30},
                }
            )
        ]
    )


def taking(item: Any) -> Any:
    """An ``async def reply(events, ctx)`` whose turn is ``list[item]``."""

    async def reply(events, ctx):  # type: ignore[no-untyped-def]
        """Never runs."""

    reply.__annotations__ = {"events": list[item], "ctx": Context}
    return reply


def test_a_cached_property_key_registers_and_is_read() -> None:
    """The runtime reads a cached property as it reads a property: the key is accepted."""
    app = notes_app("user_id")
    app.handler(LANE)(taking(Cached))
    assert LANE in app.lanes
    message = Message("notes", 0, 0, None, b'{"uid": "U1"}', {})
    assert key_value(Cached(uid="U1"), message, "user_id") == "u1"


def test_the_field_name_of_an_aliased_field_registers() -> None:
    """``user_id`` (the field) is what getattr reads: accepted."""
    app = notes_app("user_id")
    app.handler(LANE)(taking(Aliased))
    assert LANE in app.lanes


def test_the_alias_is_refused_naming_the_field() -> None:
    """``userId`` is no attribute of the event: refused, the line naming the field to give."""
    message = Message("notes", 0, 0, None, b'{"userId": "u1"}', {})
    assert key_value(Aliased.model_validate_json(message.value), message, "userId") is None
    app = notes_app("userId")
    with pytest.raises(ConfigError, match=r"'userId' is the alias of its field 'user_id'"):
        app.handler(LANE)(taking(Aliased))


@pytest.mark.parametrize("item", [bytes, Message, Any], ids=["bytes", "Message", "Any"])
def test_a_turn_without_a_model_has_no_key_check(item: Any) -> None:
    """``list[bytes]`` (the key is read from the JSON body): any key registers."""
    app = notes_app("anything.at-all")
    app.handler(LANE)(taking(item))
    assert LANE in app.lanes
