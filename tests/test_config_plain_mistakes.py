"""Common mistakes in a setting read plainly: the allowed values and the value given, as given.

Hiding secrets must not hide these: a stray space or newline from an env file, a list of hosts
with spaces after its commas, a Redis database written as a word, a setting whose name only
looks like a secret's (``KEY_PREFIX``, ``REQUIRE_AUTH``).
"""

from __future__ import annotations

import pytest
from config_helpers import config_line

_SECRET = "Hq7" + "zXw" + "Lp2"


@pytest.mark.parametrize(
    ("variable", "value", "reason"),
    [
        ("PIPELINE_TRANSPORT", "redis ", "Input should be 'kafka' or 'redis'"),
        ("PIPELINE_TRANSPORT", " kafka", "Input should be 'kafka' or 'redis'"),
        ("PIPELINE_TRANSPORT", "kafka\n", "Input should be 'kafka' or 'redis'"),
        (
            "PIPELINE_KAFKA__GROUP_PROTOCOL",
            "classic ",
            "Input should be 'auto', 'consumer' or 'classic'",
        ),
        (
            "PIPELINE_RUNTIME__SHUTDOWN_GRACE_S",
            "10 s",
            "Input should be a valid number, unable to parse string as a number",
        ),
        (
            "PIPELINE_REGISTRY__DEFAULT_COMPATIBILITY",
            "backward transitive",
            (
                "Input should be 'BACKWARD', 'BACKWARD_TRANSITIVE', 'FORWARD',"
                " 'FORWARD_TRANSITIVE', 'FULL', 'FULL_TRANSITIVE' or 'NONE'"
            ),
        ),
    ],
    ids=["trailing-space", "leading-space", "newline", "literal", "duration", "words"],
)
def test_a_plain_value_keeps_its_allowed_values_and_shows_its_whitespace(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str, reason: str
) -> None:
    """PIPELINE_TRANSPORT='redis ': every allowed value named, the value shown with its space."""
    line = config_line(monkeypatch, variable, value)
    assert line == f"invalid configuration: {variable}: {reason} (got {value!r})"


@pytest.mark.parametrize(
    "value",
    [
        "kafka:9092 ",
        "kafka1:9092, kafka2:9092",
        "kafka1:9092 ,kafka2:9092",
        "PLAINTEXT://kafka:9092,kafka2",
        "kafka1:9092; kafka2:9092",
        (
            "kafka-0.kafka-headless.svc.cluster.local:9092,"
            "kafka-1.kafka-headless.svc.cluster.local:9092 "
        ),
    ],
    ids=["trailing-space", "after-comma", "before-comma", "scheme", "semicolon", "long"],
)
def test_a_list_of_brokers_is_shown_as_given(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    """PIPELINE_KAFKA__BOOTSTRAP_SERVERS='kafka:9092 ' is shown whole, not as 'kafka:***'."""
    line = config_line(monkeypatch, "PIPELINE_KAFKA__BOOTSTRAP_SERVERS", value)
    assert line.startswith("invalid configuration: PIPELINE_KAFKA__BOOTSTRAP_SERVERS: "), line
    assert line.endswith(f" (got {value!r})"), line


@pytest.mark.parametrize(
    ("value", "path"),
    [("redis://localhost:6379/db0", "/db0"), ("redis://h:6379/orders", "/orders")],
)
def test_a_redis_database_written_as_a_word_is_shown(
    monkeypatch: pytest.MonkeyPatch, value: str, path: str
) -> None:
    """PIPELINE_REDIS__URL=redis://localhost:6379/db0: the word that is no number is the mistake."""
    line = config_line(monkeypatch, "PIPELINE_REDIS__URL", value)
    assert line == (
        "invalid configuration: PIPELINE_REDIS__URL: expected redis://host:port/db with a"
        f" database number, got {path!r} (got {value!r})"
    )


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("PIPELINE_REDIS__KEY_PREFIX", "orders prod"),
        ("PIPELINE_REDIS__KEY_PREFIX", "pl/x"),
        ("PIPELINE_REGISTRY__REQUIRE_AUTH", "yes please"),
        ("PIPELINE_INGRESS__LOG_STORE", "postgress"),
    ],
)
def test_a_setting_only_named_like_a_secret_shows_its_value(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str
) -> None:
    """A key prefix, a switch, a store's kind hold no secret: their value is what went wrong."""
    line = config_line(monkeypatch, variable, value)
    assert line.startswith(f"invalid configuration: {variable}: "), line
    assert line.endswith(f" (got {value!r})"), line


@pytest.mark.parametrize(
    "value",
    [f"{_SECRET}@x", f"orders {_SECRET}", f"password {_SECRET.lower()}", f"pl:{_SECRET.lower()}"],
    ids=["at", "mixed-word", "named", "colon"],
)
def test_a_secret_in_a_key_prefix_still_does_not_show(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    """PIPELINE_REDIS__KEY_PREFIX is echoed as any plain setting is: a secret in it is not."""
    line = config_line(monkeypatch, "PIPELINE_REDIS__KEY_PREFIX", value)
    assert line.startswith("invalid configuration: PIPELINE_REDIS__KEY_PREFIX: "), line
    assert _SECRET.lower() not in line.lower(), line.replace(_SECRET, "<SECRET>")


def test_a_setting_under_a_secret_shows_no_value(monkeypatch: pytest.MonkeyPatch) -> None:
    """A token's role that is no role: under ``tokens`` its value may be the token itself."""
    value = f'[{{"name": "ci", "token": "x", "role": "{_SECRET}"}}]'
    line = config_line(monkeypatch, "PIPELINE_REGISTRY__AUTH__TOKENS", value)
    assert line.startswith("invalid configuration: PIPELINE_REGISTRY__AUTH__TOKENS__0__ROLE: "), (
        line.replace(_SECRET, "<SECRET>")
    )
    assert "(got" not in line, line.replace(_SECRET, "<SECRET>")
    assert _SECRET not in line, line.replace(_SECRET, "<SECRET>")


def test_a_bracketed_host_does_not_show_through_the_reason(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """REGISTRY__URL='https://[<secret>]:8081/': the IP parser's reason quotes it; not shown."""
    line = config_line(monkeypatch, "PIPELINE_REGISTRY__URL", f"https://[{_SECRET}]:8081/")
    assert line.startswith("invalid configuration: PIPELINE_REGISTRY__URL: "), line
    assert _SECRET not in line, line.replace(_SECRET, "<SECRET>")
