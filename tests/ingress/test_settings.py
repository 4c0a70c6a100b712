"""The sources file: clear errors naming file and field, and no silent strands or open doors."""

from __future__ import annotations

from pathlib import Path

import pytest
from ingress.helpers import META, ROOT, build, write_sources, write_topics

from pipeline.config import IngressSettings, IngressSlotSettings, load_settings
from pipeline.errors import ConfigError
from pipeline.ingress.settings import load_sources
from pipeline.ingress.source import build_sources
from pipeline.ingress.verify import HubSignatureVerifier, UnverifiedVerifier
from pipeline.topics.spec import load_specs

TOPICS = {"messages": "messages", "engagement": "engagement"}


def load_error(tmp_path: Path, sources: dict[str, object]) -> str:
    """The message of the ConfigError that loading ``sources`` raises."""
    path = write_sources(tmp_path / "sources.yaml", sources)
    with pytest.raises(ConfigError) as caught:
        load_sources(path, set(TOPICS))
    return str(caught.value)


def test_a_valid_file_builds_every_source(tmp_path: Path) -> None:
    """A Meta source with routes builds with its verifier and the lanes of its topics."""
    sources = build(tmp_path, {"whatsapp": META}, TOPICS)
    whatsapp = sources["whatsapp"]
    assert isinstance(whatsapp.verifier, HubSignatureVerifier)
    assert whatsapp.router.default.topic == "messages"
    assert [route.topic for _, route in whatsapp.router.rules] == ["engagement"]
    assert "x-hub-signature-256" in whatsapp.keep_headers


def test_a_route_to_an_undeclared_topic_is_an_error_at_start(tmp_path: Path) -> None:
    """A rule routing to a topic missing from topics/ names the file, the field and the topic."""
    bad = {**META, "routes": [{"when": {"pointer": "/x", "exists": True}, "topic": "comments"}]}
    message = load_error(tmp_path, {"whatsapp": bad})
    assert f"{tmp_path / 'sources.yaml'}: sources.whatsapp.routes[0].topic" in message
    assert "'comments' is not declared" in message


def test_an_undeclared_default_topic_is_an_error(tmp_path: Path) -> None:
    """The default topic is checked as well."""
    message = load_error(tmp_path, {"whatsapp": {**META, "topic": "nope"}})
    assert "sources.whatsapp.topic: topic 'nope' is not declared" in message


def test_a_secret_from_a_missing_environment_variable_fails_closed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """env:NAME with NAME unset is an error naming the field, never an open door."""
    monkeypatch.delenv("PIPELINE_TEST_NO_SUCH_SECRET", raising=False)
    message = load_error(
        tmp_path, {"whatsapp": {**META, "secrets": ["env:PIPELINE_TEST_NO_SUCH_SECRET"]}}
    )
    assert "sources.whatsapp.secrets[0]" in message
    assert "PIPELINE_TEST_NO_SUCH_SECRET is not set" in message


def test_a_secret_is_read_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """env:NAME resolves to the variable's value at start."""
    monkeypatch.setenv("PIPELINE_TEST_META_SECRET", "from-env")
    path = write_sources(
        tmp_path / "s.yaml", {"w": {**META, "secrets": ["env:PIPELINE_TEST_META_SECRET"]}}
    )
    assert load_sources(path, set(TOPICS))["w"].secrets == ["from-env"]


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("gh-secret\n", "ends with a newline"),
        ("gh-secret\r\n", "ends with a newline"),
        ("gh-secret  ", "begins or ends with whitespace"),
        ("\tgh-secret", "begins or ends with whitespace"),
        (" \n ", "is not set or empty"),
    ],
    ids=["newline", "crlf", "trailing-spaces", "leading-tab", "only-whitespace"],
)
def test_a_secret_from_the_environment_with_surrounding_whitespace_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, value: str, problem: str
) -> None:
    """A secret variable with whitespace around it (echo) is refused, not a 401 on every request."""
    monkeypatch.setenv("PIPELINE_TEST_SPACED_SECRET", value)
    message = load_error(
        tmp_path, {"whatsapp": {**META, "secrets": ["env:PIPELINE_TEST_SPACED_SECRET"]}}
    )
    assert (
        "sources.whatsapp.secrets[0]: environment variable PIPELINE_TEST_SPACED_SECRET" in message
    )
    assert problem in message
    assert "gh-secret" not in message


@pytest.mark.parametrize(
    ("field", "value", "problem"),
    [
        ("secrets", ["meta-app-secret "], "secrets[0]: a secret begins or ends with whitespace"),
        ("secrets", ["   "], "secrets[0]: a secret must not be empty"),
        ("verify_token", "let-me-in\n", "verify_token: a secret ends with a newline"),
    ],
    ids=["trailing-space", "only-spaces", "token-newline"],
)
def test_a_secret_written_with_surrounding_whitespace_is_refused(
    tmp_path: Path, field: str, value: object, problem: str
) -> None:
    """A literal secret or verify token with whitespace around it, or only spaces, is refused."""
    message = load_error(tmp_path, {"whatsapp": {**META, field: value}})
    assert f"sources.whatsapp.{problem}" in message
    assert "meta-app-secret" not in message
    assert "let-me-in" not in message


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"secrets": []}, "scheme 'meta' needs at least one secret"),
        ({"scheme": "sha256"}, "sources.whatsapp.scheme"),
        ({"scheme": "hmac"}, "'hmac' options are required"),
        ({"tenant": {"pointer": "entry/0"}}, "a JSON pointer starts with '/'"),
        ({"tenant": {"pointer": "/a", "header": "x"}}, "set exactly one of pointer"),
        ({"routes": [{"when": {"pointer": "/a"}, "topic": "messages"}]}, "exactly one of equals"),
        ({"max_body_bytes": 0}, "sources.whatsapp.max_body_bytes"),
        ({"colour": "blue"}, "sources.whatsapp.colour: unknown field"),
    ],
    ids=[
        "no-secret",
        "bad-scheme",
        "hmac-options",
        "pointer",
        "value-from",
        "condition",
        "body-cap",
        "unknown-field",
    ],
)
def test_invalid_sources_name_the_field(
    tmp_path: Path, change: dict[str, object], expected: str
) -> None:
    """Each kind of mistake is reported with its field path."""
    assert expected in load_error(tmp_path, {"whatsapp": {**META, **change}})


def test_secrets_are_never_echoed_in_errors(tmp_path: Path) -> None:
    """A wrongly typed secret is reported without its value."""
    message = load_error(tmp_path, {"whatsapp": {**META, "secrets": [{"v": "topsecret"}]}})
    assert "sources.whatsapp.secrets[0]" in message
    assert "topsecret" not in message


def test_the_none_scheme_must_be_explicit_and_secretless(tmp_path: Path) -> None:
    """Scheme none builds an accept-all verifier; with secrets it is an error."""
    plain = {"scheme": "none", "topic": "messages"}
    assert isinstance(build(tmp_path, {"open": plain}, TOPICS)["open"].verifier, UnverifiedVerifier)
    assert "scheme 'none' verifies nothing" in load_error(
        tmp_path, {"open": {**plain, "secrets": ["x"]}}
    )


def test_missing_or_invalid_files_are_named(tmp_path: Path) -> None:
    """A missing file, invalid YAML and a non-mapping each name the file."""
    missing = tmp_path / "absent.yaml"
    with pytest.raises(ConfigError, match=str(missing)):
        load_sources(missing, set(TOPICS))
    broken = tmp_path / "broken.yaml"
    broken.write_text("sources: [unclosed", encoding="utf-8")
    with pytest.raises(ConfigError, match="invalid YAML"):
        load_sources(broken, set(TOPICS))
    listing = tmp_path / "list.yaml"
    listing.write_text("- a\n- b\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="expected a mapping"):
        load_sources(listing, set(TOPICS))


def test_a_missing_sources_file_says_what_to_copy_or_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No file at the path: one line naming it, the example to copy and the setting to change."""
    missing = tmp_path / "sources.yaml"
    with pytest.raises(ConfigError) as caught:
        load_sources(missing, set(TOPICS))
    (line,) = str(caught.value).splitlines()
    assert line.startswith(f"no sources file at {missing}: "), line
    assert "Errno" not in line
    example = "deploy/local/sources.example.yaml"
    assert f"copy {example}" in line
    assert (ROOT / example).is_file()  # what it names is there to copy
    assert "PIPELINE_INGRESS__SOURCES_FILE" in line
    assert "--sources" in line
    monkeypatch.setenv("PIPELINE_INGRESS__SOURCES_FILE", str(missing))  # and is the setting
    assert load_settings().ingress.sources_file == missing


def test_a_sources_file_of_nested_aliases_is_refused_in_a_short_line(tmp_path: Path) -> None:
    """A few hundred bytes of nested YAML aliases expanding to millions of values are refused.

    Before, the sources file was walked whole (and its error printed whole), as topic files
    were before 69d76ed.
    """
    anchors = ['  l0: &l0 ["x", "x", "x", "x", "x", "x", "x", "x", "x"]']
    anchors += [f"  l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]" for i in range(1, 7)]
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("anchors:\n" + "\n".join(anchors) + "\nsources: *l6\n", encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        load_sources(bomb, set(TOPICS))
    (line,) = str(info.value).splitlines()
    assert line.startswith(f"{bomb}: ")
    assert "aliases" in line
    assert len(line) < 500


@pytest.mark.parametrize(
    ("text", "key"),
    [
        (
            (
                "sources:\n  github: {scheme: none, topic: messages}\n"
                "  github: {scheme: none, topic: engagement}\n"
            ),
            "'github'",
        ),
        (
            (
                "sources:\n  github:\n    scheme: github\n    secrets: [old-secret]\n"
                "    topic: messages\n    secrets: [new-secret]\n"
            ),
            "'secrets'",
        ),
    ],
)
def test_a_key_given_twice_is_refused_with_its_line(tmp_path: Path, text: str, key: str) -> None:
    """A source or field given twice is refused with its line, not silently replaced by the last."""
    path = tmp_path / "sources.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError) as caught:
        load_sources(path, set(TOPICS))
    message = str(caught.value)
    assert message.startswith(f"{path}: line ")
    assert f"duplicate key {key}" in message
    assert "secret" not in message.replace("'secrets'", "")


def test_a_body_cap_above_the_message_size_is_an_error(tmp_path: Path) -> None:
    """A source whose bodies could not be produced is refused at start."""
    write_topics(tmp_path / "topics", TOPICS)
    with pytest.raises(ConfigError, match="max_body_bytes"):
        build(tmp_path, {"big": {**META, "max_body_bytes": 8 * 1_048_576}}, TOPICS)


def test_ingress_settings_have_documented_defaults() -> None:
    """The sources file defaults to sources.yaml and SQLite to full durability."""
    settings = IngressSettings()
    assert settings.sources_file == Path("sources.yaml")
    assert settings.log_store == "sqlite"
    assert settings.sqlite_synchronous == "FULL"


def test_ingress_settings_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """PIPELINE_INGRESS__* variables fill the section (as the CLI reads them)."""
    from pipeline.ingress.cli import _settings  # noqa: PLC0415

    monkeypatch.setenv("PIPELINE_INGRESS__SOURCES_FILE", "/etc/pipeline/sources.yaml")
    monkeypatch.setenv("PIPELINE_INGRESS__SWEEPER__PATIENCE_S", "42")
    _, ingress = _settings(None)
    assert ingress.sources_file == Path("/etc/pipeline/sources.yaml")
    assert ingress.sweeper.patience_s == 42


def test_a_sources_admission_overrides_only_what_it_sets(tmp_path: Path) -> None:
    """A source's ``admission:`` replaces the fields it names; the others stay the environment's.

    It was a whole settings object: a source setting only ``max_in_flight`` took the class's
    defaults for the rest (a 60 s Retry-After where the environment said 5).
    """
    sources = build(
        tmp_path,
        {"meta": {**META, "admission": {"max_in_flight": 1}}},
        TOPICS,
        admission=IngressSlotSettings(max_in_flight=512, max_retry_after_s=1),
    )
    slots = sources["meta"].admission
    assert slots.retry_after_s() == 1  # the cold-start 2 s, clamped to the environment's 1 s
    assert slots.in_flight == 0


def test_the_example_sources_file_is_valid(monkeypatch: pytest.MonkeyPatch) -> None:
    """deploy/local/sources.example.yaml builds with the three secrets the guide exports."""
    root = Path(__file__).resolve().parents[2]
    for name in ("META_APP_SECRET", "META_VERIFY_TOKEN", "GITHUB_WEBHOOK_SECRET"):
        monkeypatch.setenv(name, "example")
    specs = load_specs(root / "topics")
    configs = load_sources(
        root / "deploy/local/sources.example.yaml", {spec.name for spec in specs}
    )
    built = build_sources(
        configs, specs, admission=IngressSlotSettings(), max_message_bytes=1_114_112
    )
    assert sorted(built) == ["github", "whatsapp"]
