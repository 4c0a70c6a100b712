"""A debounced lane's ``debounce.key`` naming no field of its events must not merge conversations.

A typo (``usr_id`` for the model's ``user_id``) made every message fall back to its message
key, or to one shared "" conversation without one: two users' notes became one turn.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest
from pydantic import BaseModel, ConfigDict, computed_field

from pipeline.errors import ConfigError
from pipeline.runtime import App, Context
from pipeline.testing import TestApp
from pipeline.topics.spec import TopicSpec

LANE = "notes"


class Note(BaseModel):
    """A user's note: the conversation is the user."""

    user_id: str
    text: str


class MaybeNote(BaseModel):
    """A note whose user a producer may leave out."""

    user_id: str | None = None
    text: str


def declare(directory: Path, key: str) -> Path:
    """A topics directory declaring the debounced lane ``notes`` keyed on ``key``."""
    path = directory / "notes.yaml"
    path.write_text(
        f"name: {LANE}\npartitions: 1\n"
        f"debounce:\n  key: {key}\n  quiet_s: 4\n  max_wait_s: 30\n  max_batch: 10\n"
    )
    return path


def spec(key: str) -> TopicSpec:
    """The lane ``notes`` as a spec given to App() directly."""
    return TopicSpec.model_validate(
        {"name": LANE, "partitions": 1, "debounce": {"key": key, "quiet_s": 4, "max_wait_s": 30}}
    )


def test_a_key_the_model_lacks_is_refused_when_the_handler_is_registered(tmp_path: Path) -> None:
    """``usr_id`` on a model of ``user_id``: one line naming the file, lane, key and fields."""
    path = declare(tmp_path, "usr_id")
    app = App(tmp_path)
    with pytest.raises(ConfigError) as caught:

        @app.handler(LANE)
        async def handle(events: list[Note], ctx: Context) -> None:
            """Never registered."""

    line = str(caught.value)
    assert "\n" not in line
    assert str(path) in line
    assert "'notes'" in line
    assert "'usr_id'" in line
    assert "Note" in line
    assert "user_id, text" in line
    assert LANE not in app.lanes


def test_a_spec_given_directly_is_named_by_its_topic() -> None:
    """Without a file, the line names the lane's topic among the specs given to App()."""
    app = App([spec("usr_id")])
    with pytest.raises(ConfigError, match=r"the specs given to App\(\) \(topic 'notes'\)"):

        @app.handler(LANE)
        async def handle(events: list[Note], ctx: Context) -> None:
            """Never registered."""


def test_a_dotted_key_is_not_a_path_into_the_event() -> None:
    """``user.id`` names a top-level field, which a model cannot have: refused, saying so."""
    app = App([spec("user.id")])
    with pytest.raises(ConfigError, match="top-level field of the event, not a path"):

        @app.handler(LANE)
        async def handle(events: list[Note], ctx: Context) -> None:
            """Never registered."""


def test_a_method_of_the_model_is_no_field() -> None:
    """``copy`` is an attribute of every model (a method): every event would give one value."""
    app = App([spec("copy")])
    with pytest.raises(ConfigError, match="'copy'"):

        @app.handler(LANE)
        async def handle(events: list[Note], ctx: Context) -> None:
            """Never registered."""


def test_keys_the_model_can_give_are_accepted() -> None:
    """A field, a computed field, and any key of a model that keeps extra fields."""

    class Derived(BaseModel):
        user_id: str

        @computed_field  # type: ignore[prop-decorator]
        @property
        def thread(self) -> str:
            return f"t-{self.user_id}"

    class Open(BaseModel):
        model_config = ConfigDict(extra="allow")
        text: str

    for key, model in (("user_id", Note), ("thread", Derived), ("anything", Open)):
        app = App([spec(key)])

        async def handle(events: list[bytes], ctx: Context) -> None:
            """Registered (its annotation set below: the model is local to this test)."""

        handle.__annotations__ = {"events": list[model], "ctx": Context, "return": None}  # type: ignore[valid-type]
        app.handler(LANE)(handle)
        assert LANE in app.lanes, key


def test_raw_handlers_are_not_checked() -> None:
    """``list[bytes]`` has no fields to check the key against: it is read from the JSON body."""
    app = App([spec("usr_id")])

    @app.handler(LANE)
    async def handle(events: list[bytes], ctx: Context) -> None:
        """Registered."""

    assert LANE in app.lanes


async def test_messages_without_the_key_are_turns_of_their_own(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Two users' notes lacking ``user_id`` and a message key: two turns, one warning.

    Notes carrying the field still coalesce by it.
    """
    app = App([spec("user_id")])
    turns: list[list[str]] = []

    @app.handler(LANE)
    async def handle(events: list[MaybeNote], ctx: Context) -> None:
        turns.append(sorted(e.text for e in events))

    caplog.set_level(logging.WARNING, logger="pipeline.runtime.turns")
    async with TestApp(app) as t:
        await t.send(LANE, {"text": "a"}, event_id="evt-a")
        await t.send(LANE, {"text": "b"})  # no event id: its place in the topic names it
        await t.send(LANE, {"user_id": "u3", "text": "c"})
        await t.send(LANE, {"user_id": "u3", "text": "d"})
        await t.drain()
    assert sorted(turns) == [["a"], ["b"], ["c", "d"]]
    warnings = [r.getMessage() for r in caplog.records if "debounce.key" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert re.search(r"lane notes: .*'user_id'", warnings[0])


async def test_a_body_without_the_key_keeps_its_message_key_as_its_conversation() -> None:
    """A keyed message lacking the field still coalesces by its message key, as before."""
    app = App([spec("user_id")])
    turns: list[list[str]] = []

    @app.handler(LANE)
    async def handle(events: list[bytes], ctx: Context) -> None:
        turns.append(sorted(e.decode() for e in events))

    async with TestApp(app) as t:
        await t.send(LANE, {"text": "a"}, key="u1")
        await t.send(LANE, {"text": "b"}, key="u1")
        await t.send(LANE, {"text": "c"})
        await t.send(LANE, {"user_id": "", "text": "d"})  # empty: no conversation either
        await t.drain()
    assert sorted(turns) == [
        ['{"text": "a"}', '{"text": "b"}'],
        ['{"text": "c"}'],
        ['{"user_id": "", "text": "d"}'],
    ]
