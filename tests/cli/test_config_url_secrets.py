"""A bad URL setting's line shows only what is safe: never a password, token or key.

Every secret below is built at run time from ``_SECRET`` (no literal of it in this file) and
no assertion prints a line holding one: a failure names the form, not the line.
"""

from __future__ import annotations

import pytest

from pipeline.config import load_settings, shown_url
from pipeline.errors import ConfigError

_SECRET = "S3cret" + "PW"


def _line(monkeypatch: pytest.MonkeyPatch, variable: str, value: str) -> str:
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigError) as caught:
        load_settings()
    return str(caught.value)


def _safe(text: str) -> str:
    """``text`` fit to print in a failure: the secret's each occurrence named, not shown."""
    return text.replace(_SECRET, "<SECRET>")


@pytest.mark.parametrize(
    ("variable", "value", "shown"),
    [
        (
            "PIPELINE_POSTGRES__URL",
            f"host=db user=pipeline password={_SECRET} dbname=pipeline",
            "host=db user=pipeline password=*** dbname=pipeline",
        ),
        (
            "PIPELINE_POSTGRES__URL",
            f"host=db port=5432 passfile=/x/{_SECRET} sslpassword='{_SECRET} x' dbname=p",
            "host=db port=5432 passfile=*** sslpassword=*** dbname=p",
        ),
        ("PIPELINE_REDIS__URL", f"{_SECRET}@redis://localhost:6379", "***@redis://localhost:6379"),
        (
            "PIPELINE_REGISTRY__URL",
            f"registry.example.com/token/{_SECRET}",
            "registry.example.com/token/***",
        ),
        (
            "PIPELINE_REGISTRY__URL",
            f"registry.example.com/v1/{_SECRET}",
            "registry.example.com/v1/***",
        ),
        (
            "PIPELINE_REDIS__URL",
            f"redis://default:{_SECRET}@h:6379/{_SECRET}",
            "redis://***@h:6379/***",
        ),
        (
            "PIPELINE_REDIS__URL",
            f"rediss://:{_SECRET}@cache.example.com:6380/0?ssl_certfile={_SECRET}&pasword={_SECRET}",
            "rediss://***@cache.example.com:6380/0?ssl_certfile=***&pasword=***",
        ),
        (
            "PIPELINE_POSTGRES__URL",
            f"postgresql://app:{_SECRET}@db:5432/x?sslpassword={_SECRET}&bogus=1",
            "postgresql://***@db:5432/x?sslpassword=***&***=***",
        ),
        (
            "PIPELINE_REGISTRY__URL",
            f"https://ci:{_SECRET}@registry.example.com:0/apis/{_SECRET}?token={_SECRET}#{_SECRET}",
            "https://***@registry.example.com:0/apis/***?***=***#***",
        ),
        (
            "PIPELINE_REGISTRY__URL",
            f"http://registry.example.com:80a/token/{_SECRET}",
            "http://registry.example.com:***",
        ),
    ],
    ids=[
        "libpq-keywords",
        "libpq-keywords-quoted",
        "secret-before-scheme",
        "path-token",
        "opaque-path-segment",
        "redis-user-password-and-path",
        "rediss-query",
        "postgresql",
        "https-everywhere",
        "http-bad-port",
    ],
)
def test_a_bad_url_setting_never_echoes_its_secret(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str, shown: str
) -> None:
    """The line ends with the value given, each secret part of it ``***``."""
    line = _line(monkeypatch, variable, value)
    assert _SECRET not in line, _safe(line)
    assert line.endswith(f" (got {shown!r})"), _safe(line)


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        (
            f"http://AKIAIOSFODNN7EXAMPLE:{_SECRET}@127.0.0.1:9000/bucket",
            "http://***@127.0.0.1:9000/bucket",
        ),
        (
            f"https://s3.eu-west-1.amazonaws.com/bucket/AKIAIOSFODNN7EXAMPLE?X-Amz-Signature={_SECRET}",
            "https://s3.eu-west-1.amazonaws.com/bucket/***?***=***",
        ),
        (
            f"https://hooks.example.com/services/T0A1/{_SECRET}",
            "https://hooks.example.com/services/***/***",
        ),
        ("redis://localhost:6379/0", "redis://localhost:6379/0"),
        (f"localhost:6379/0?password={_SECRET}", "localhost:6379/0?password=***"),
        (f"user:{_SECRET}@[::1]:6379/0", "***@[::1]:6379/0"),
        ("unix:///run/redis/redis.sock?db=1", "unix:///run/redis/redis.sock?db=1"),
    ],
    ids=[
        "s3-endpoint-keys",
        "s3-presigned",
        "webhook-token",
        "plain",
        "no-scheme-query",
        "no-scheme-ipv6",
        "unix",
    ],
)
def test_a_url_is_shown_without_credentials(value: str, shown: str) -> None:
    """S3 endpoints and other URLs: userinfo, query values and opaque path tokens hidden."""
    got = shown_url(value)
    assert got is not None
    assert _SECRET not in got, _safe(got)
    assert got == shown, _safe(got)


def test_a_value_that_reads_as_nothing_known_gives_only_its_length(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No scheme, no host and no keywords: its length only."""
    value = f"my {_SECRET} here"
    line = _line(monkeypatch, "PIPELINE_REDIS__URL", value)
    assert _SECRET not in line, _safe(line)
    assert line.endswith(f" (got {len(value)} characters, not shown)"), _safe(line)


def test_a_misplaced_credential_in_another_address_setting_is_hidden(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """PIPELINE_KAFKA__BOOTSTRAP_SERVERS=user:pw@host (no port) is refused without its password."""
    line = _line(monkeypatch, "PIPELINE_KAFKA__BOOTSTRAP_SERVERS", f"app:{_SECRET}@kafka")
    assert _SECRET not in line, _safe(line)
    assert line.endswith(" (got '***@kafka')"), _safe(line)


def test_the_reason_names_no_hidden_piece_either(monkeypatch: pytest.MonkeyPatch) -> None:
    """A path that is no database number: the reason quotes the path, its token hidden there too."""
    line = _line(monkeypatch, "PIPELINE_REDIS__URL", f"redis://h:6379/{_SECRET}")
    assert _SECRET not in line, _safe(line)
    assert line == (
        "invalid configuration: PIPELINE_REDIS__URL: expected redis://host:port/db with a"
        " database number, got '/***' (got 'redis://h:6379/***')"
    ), _safe(line)
