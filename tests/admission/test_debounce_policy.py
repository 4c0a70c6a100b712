"""The debounce policy in topics/*.yaml and the buffered message codec."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from pipeline.admission.debounce import keys as debounce_keys
from pipeline.admission.debounce.codec import BufferedMessage, CodecError, decode, encode
from pipeline.envelope import Message
from pipeline.errors import TopicSpecError
from pipeline.topics.spec import DebouncePolicy, load_spec


def write(tmp_path, text: str):
    """Write a declaration file and return its path."""
    path = tmp_path / "ai.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def test_policy_is_read_from_the_declaration(tmp_path):
    """A debounce mapping in a declaration becomes a validated DebouncePolicy."""
    spec = load_spec(
        write(
            tmp_path,
            "name: ai\npartitions: 1\n"
            "debounce: {key: conversation_id, quiet_s: 4, max_wait_s: 30, max_batch: 100}\n",
        )
    )
    assert spec.debounce == DebouncePolicy(
        key="conversation_id", quiet_s=4, max_wait_s=30, max_batch=100
    )


def test_max_wait_and_batch_have_defaults():
    """Without max_wait_s the wait is 30 s (or quiet_s if longer); max_batch defaults to 100."""
    assert DebouncePolicy(key="c", quiet_s=4).max_wait_s == 30
    assert DebouncePolicy(key="c", quiet_s=45).max_wait_s == 45
    assert DebouncePolicy(key="c", quiet_s=4).max_batch == 100


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ({"key": "c", "quiet_s": 0}, "quiet_s"),
        ({"key": "c", "quiet_s": 5, "max_wait_s": 2}, "max_wait_s"),
        ({"key": "c", "quiet_s": 1, "max_batch": 0}, "max_batch"),
        ({"key": "", "quiet_s": 1}, "key"),
        ({"quiet_s": 1}, "key"),
    ],
)
def test_invalid_policies_are_refused(fields, problem):
    """A zero quiet period, a max wait below it, an empty batch or a missing key is refused."""
    with pytest.raises(ValidationError) as info:
        DebouncePolicy.model_validate(fields)
    errors = [e for e in info.value.errors() if e["type"] != "default_factory_not_called"]
    assert {str(e["loc"][0]) for e in errors} == {problem}


def test_unknown_field_names_the_debounce_fields(tmp_path):
    """A misspelt debounce field is reported with the debounce fields, not the topic's."""
    path = write(tmp_path, "name: ai\npartitions: 1\ndebounce: {key: c, quiet: 4}\n")
    with pytest.raises(TopicSpecError) as info:
        load_spec(path)
    assert "debounce.quiet: unknown field (expected one of: key, quiet_s, max_wait_s" in str(
        info.value
    )


@pytest.mark.parametrize("key", [b"k", b"", None])
def test_codec_round_trips_every_field(key):
    """Encoding then decoding gives the same message, whatever its key, headers and payload."""
    message = BufferedMessage.of(
        Message("chat.in", 7, 2**40, key, b"\x00:\xff" * 50, {"a": b"1", "b": b""}, 1_700_000)
    )
    assert decode(encode(message)) == message
    assert decode(encode(BufferedMessage("t", 0, 0, None, b""))) == BufferedMessage(
        "t", 0, 0, None, b""
    )


def test_codec_refuses_truncated_records():
    """A record cut short is an error, not a shorter message."""
    data = encode(BufferedMessage("t", 0, 1, b"k", b"value", {"h": b"v"}))
    for cut in (3, len(data) - 1):
        with pytest.raises(CodecError):
            decode(data[:cut])


def test_every_key_of_a_lane_shares_one_hash_tag():
    """The due set, buffer and state keys of a lane hash to the same cluster slot."""
    names = [
        *debounce_keys.conversation_keys("pl", "ai_turns", "conv{1}"),
        *debounce_keys.lane_keys("pl", "ai_turns"),
    ]
    assert {name[: name.index("}") + 1] for name in names} == {"{pl:deb:ai_turns}"}
