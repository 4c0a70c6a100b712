"""A password in a setting's URL never reaches an error, a warning or a printed address.

The passwords here hold a character a URL must percent-encode and a user may leave as typed
(``/``, ``#``, ``%``, ``@``, ``&``): the parsers then split the URL elsewhere and quote a piece
of the password as the port, path, host, option or token at fault. The commands run as
subprocesses, as an operator runs them; nothing is created on the running services.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from support import cli_environment, run_pipeline

from pipeline.config import hide_credentials, load_settings
from pipeline.errors import ConfigError
from pipeline.reachability import checked_http_url, safe_url


def refused(variable: str, value: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """The ConfigError message ``load_settings`` gives with ``variable`` set to ``value``."""
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigError) as caught:
        load_settings()
    return str(caught.value)


@pytest.mark.parametrize(
    ("url", "pieces"),
    [
        ("redis://:Sesame/Tail@127.0.0.1:6379/0", ["Sesame", "Tail"]),  # port 'Sesame'
        ("redis://:Sesame#Tail@127.0.0.1:6379/0", ["Sesame", "Tail"]),
        ("redis://:12/SesameTail@127.0.0.1:6379/0", ["SesameTail"]),  # path '/SesameTail@...'
    ],
)
def test_a_redis_url_error_quotes_no_piece_of_its_password(
    url: str, pieces: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """PIPELINE_REDIS__URL refused for a port or path that is a piece of the password hides it."""
    message = refused("PIPELINE_REDIS__URL", url, monkeypatch)
    assert message.startswith("invalid configuration: PIPELINE_REDIS__URL: expected"), message
    for piece in pieces:
        assert piece not in message, message
    assert "***" in message


def test_a_registry_url_error_quotes_no_piece_of_its_password(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """PIPELINE_REGISTRY__URL and --url refused for a port that is the password's head hide it."""
    url = "http://reader:Sesame/Tail@127.0.0.1:8081"
    message = refused("PIPELINE_REGISTRY__URL", url, monkeypatch)
    assert "Sesame" not in message, message
    with pytest.raises(ConfigError) as caught:
        checked_http_url(url, "--url")
    assert "Sesame" not in str(caught.value)
    assert "Tail" not in str(caught.value)


@pytest.mark.parametrize("variable", ["PIPELINE_POSTGRES__URL", "PIPELINE_REGISTRY__STORE"])
@pytest.mark.parametrize(
    "url",
    [
        "postgresql://pipeline:Ses%ameTail@127.0.0.1:5432/pipeline",
        "postgresql://pipeline:Ses%00ameTail@127.0.0.1:5432/pipeline",
    ],
)
def test_a_postgres_url_libpq_cannot_read_is_refused_at_start(
    variable: str, url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A PostgreSQL URL libpq cannot parse is refused when read, its password hidden."""
    message = refused(variable, url, monkeypatch)
    assert message.startswith(f"invalid configuration: {variable}: libpq cannot read"), message
    assert "ameTail" not in message, message
    assert "must be percent-encoded (%25" in message


@pytest.mark.parametrize("variable", ["PIPELINE_POSTGRES__URL", "PIPELINE_REGISTRY__STORE"])
def test_a_postgres_url_with_a_second_at_is_refused_at_start(
    variable: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An '@' left unencoded in the password ends it for libpq: refused, in one line, hidden.

    libpq reads such a URL without complaint (the user info ends at the first '@') and then
    names the password's tail as the host it cannot resolve, at every retry.
    """
    url = "postgresql://pipeline:Sesa@meTail@127.0.0.1:1/pipeline"
    message = refused(variable, url, monkeypatch)
    assert message.startswith(f"invalid configuration: {variable}: "), message
    assert "more than one '@'" in message, message
    assert "\n" not in message.strip(), message
    for piece in ("Sesa", "meTail"):
        assert piece not in message, message


@pytest.mark.parametrize("variable", ["PIPELINE_POSTGRES__URL", "PIPELINE_REGISTRY__STORE"])
def test_a_postgres_password_option_with_an_ampersand_is_hidden(
    variable: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The refusal of a '?password=' value libpq cuts at an unencoded '&' quotes no piece."""
    url = "postgresql://pipeline@127.0.0.1:1/pipeline?password=Sesa&meTail"
    message = refused(variable, url, monkeypatch)
    assert message.startswith(f"invalid configuration: {variable}: libpq cannot read"), message
    for piece in ("Sesa", "meTail"):
        assert piece not in message, message


def test_a_postgres_url_libpq_reads_is_accepted(monkeypatch: pytest.MonkeyPatch) -> None:
    """A well-formed URL, its password percent-encoded, passes the check."""
    url = "postgresql://pipeline:Ses%25ame%2FTail@127.0.0.1:5432/pipeline?sslmode=disable"
    monkeypatch.setenv("PIPELINE_POSTGRES__URL", url)
    assert load_settings().postgres.url == url


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://:Sesame/Tail@127.0.0.1:6379/0", "redis://:***@127.0.0.1:6379/0"),
        ("redis://:Sesame#Tail@h:6379/0", "redis://:***@h:6379/0"),
        ("postgresql://u:Ses/ame@h:5432/db", "postgresql://u:***@h:5432/db"),
        ("redis://u:Sesame@h:6379/0", "redis://u:***@h:6379/0"),
        ("redis://h:6379/0?password=Sesame", "redis://h:6379/0?password=***"),
        ("redis://h:6379/0?password=Sesa#meTail", "redis://h:6379/0?password=***"),
        ("redis://h:6379/0?password=Sesa&meTail", "redis://h:6379/0?password=***"),
        ("redis://h:6379/0?db=1&password=Sesa;me#Tail", "redis://h:6379/0?db=1&password=***"),
        ("postgresql://u@h/db?password=Ses/a?me#Tail", "postgresql://u@h/db?password=***"),
        ("redis://h:6379/0#Sesame", "redis://h:6379/0#Sesame"),
        ("sqlite:///registry.db", "sqlite:///registry.db"),
        ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
    ],
)
def test_safe_url_hides_a_password_urlsplit_does_not_see(url: str, shown: str) -> None:
    """safe_url hides a password whose unencoded '/' or '#' ends urlsplit's authority early."""
    assert safe_url(url) == shown


@pytest.mark.parametrize(
    "url",
    [
        "redis://127.0.0.1:1/0?password=Sesa#meTail",
        "postgresql://u@h/db?password=Sesa&meTail",
        "postgresql://u@h/db?sslmode=disable;password=Sesa;meTail",
    ],
)
def test_hide_credentials_hides_all_that_follows_a_password_option(url: str) -> None:
    """A '#', '&' or ';' left unencoded in a '?password=' value ends no part of the secret."""
    text = f"cannot reach {url}: bad option 'meTail' after 'Sesa'"
    said = hide_credentials(text, url)
    for piece in ("Sesa", "meTail"):
        assert piece not in said, said


def test_hide_credentials_leaves_a_message_without_them_alone() -> None:
    """A URL without a user, password or password option changes nothing in the text."""
    text = "cannot reach Redis at redis://127.0.0.1:6379/0: refused"
    assert hide_credentials(text, "redis://127.0.0.1:6379/0") == text


@pytest.mark.parametrize("command", [["status"], ["ingress", "serve", "--port", "0"]])
@pytest.mark.parametrize(
    "url",
    [
        "postgresql://pipeline:Pipe%lineSesame@127.0.0.1:1/pipeline",
        "postgresql://pipeline:Pipe@lineSesame@127.0.0.1:1/pipeline",  # libpq: host 'line...'
    ],
)
def test_a_log_database_url_with_a_stray_character_is_not_printed(
    command: list[str], url: str, tmp_path: Path
) -> None:
    """Neither 'status' nor 'ingress serve' prints a log database password with a '%' or '@'."""
    env = cli_environment(
        tmp_path, PIPELINE_INGRESS__LOG_STORE="postgres", PIPELINE_POSTGRES__URL=url
    )
    result = run_pipeline(*command, env=env, cwd=tmp_path)
    said = result.stdout + result.stderr
    assert "lineSesame" not in said, said
    assert "PIPELINE_POSTGRES__URL" in said, said
    assert result.returncode == 2, said


def test_topics_apply_names_the_members_redis_without_its_password(
    tmp_path: Path, kafka_service: str
) -> None:
    """The warning of 'topics apply' that the members' Redis cannot be read hides its password."""
    env = cli_environment(
        tmp_path,
        PIPELINE_TRANSPORT="kafka",
        PIPELINE_KAFKA__BOOTSTRAP_SERVERS=kafka_service,
        PIPELINE_REDIS__URL="redis://:MembersSesame@127.0.0.1:1/0",
    )
    result = run_pipeline("topics", "apply", "--dry-run", env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "MembersSesame" not in result.stdout + result.stderr
    assert "cannot check the members' Redis (redis://***@127.0.0.1:1/0," in result.stderr


def test_status_names_a_redis_url_without_a_password_option_cut_at_a_hash(
    tmp_path: Path,
) -> None:
    """'status' prints no piece of a Redis '?password=' whose '#' urlsplit reads as a fragment."""
    env = cli_environment(
        tmp_path, PIPELINE_REDIS__URL="redis://127.0.0.1:1/0?password=Sesa#meTail"
    )
    result = run_pipeline("status", env=env, cwd=tmp_path)
    said = result.stdout + result.stderr
    assert "redis://127.0.0.1:1/0?password=***" in said, said
    for piece in ("Sesa", "meTail"):
        assert piece not in said, said


def test_a_registry_servers_settings_error_quotes_no_piece_of_its_password(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`pipeline registry serve`'s own settings hide a password its URL parser split."""
    from pipeline.registry.settings import load_registry_settings  # noqa: PLC0415

    monkeypatch.setenv("PIPELINE_REGISTRY__URL", "http://reader:Sesame/Tail@127.0.0.1:8081")
    with pytest.raises(ConfigError) as caught:
        load_registry_settings()
    line = str(caught.value)
    assert line.startswith("invalid registry configuration: PIPELINE_REGISTRY__URL: "), line
    assert "Sesame" not in line
    assert "Tail" not in line
    assert "Value error, " not in line
