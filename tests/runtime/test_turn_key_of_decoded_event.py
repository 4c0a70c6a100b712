"""A debounced lane finds its conversation in the event it decoded, not only in the raw value.

For an offloaded message the value is its reference (``pl-offload``), not the body: a
``debounce.key`` read there was never found, and every offloaded message fell back to its message
key (or a turn of its own), whatever conversation its body named. A ``dict`` lane's event is the
body already read as JSON.
"""

from __future__ import annotations

from pipeline.envelope import Message
from pipeline.runtime.turns import key_value

REFERENCE = b'{"ref": "s3://bucket/obj", "size": 300000}'


def _message(value: bytes) -> Message:
    return Message("notes", 0, 7, b"k", value, {"pl-offload": b"1"})


def test_a_dict_event_names_its_conversation() -> None:
    """The member of the dict the lane decoded."""
    assert key_value({"conversation_id": "c-9"}, _message(REFERENCE), "conversation_id") == "c-9"


def test_an_offloaded_payload_names_its_conversation_not_its_reference() -> None:
    """The fetched bytes (a bytes lane) and text (a str lane), not the reference's JSON."""
    body = b'{"conversation_id": "c-7", "text": "hi"}'
    assert key_value(body, _message(REFERENCE), "conversation_id") == "c-7"
    assert key_value(body.decode(), _message(REFERENCE), "conversation_id") == "c-7"


def test_an_event_without_a_body_of_its_own_reads_the_value() -> None:
    """A ``Message`` event (or anything else) still reads the message's value."""
    message = _message(b'{"conversation_id": "c-1"}')
    assert key_value(message, message, "conversation_id") == "c-1"
    assert key_value(object(), message, "conversation_id") == "c-1"
