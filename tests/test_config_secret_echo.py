"""A bad setting's line never echoes a secret, whatever the setting and wherever the secret sits.

Every secret is built at run time (no literal of one in this file) and no assertion prints a
line holding one: a failure names the form and the line with the secret as ``<SECRET>``.
"""

from __future__ import annotations

import json
import random
import re
import string

import pytest
from config_helpers import config_line

from pipeline.config import shown_url

_SECRET = "Hx7" + "qZp"
_LOWER_SECRET = "hunter" + "xyz"


def _safe(text: str, *secrets: str) -> str:
    """``text`` fit to print in a failure: each secret named, not shown."""
    for secret in secrets:
        text = text.replace(secret, "<SECRET>")
    return text


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        (f"host=h password={_SECRET} port=x", "host=h password=*** port=x"),
        (f"host=h\tpassword={_SECRET}\tport=x", "host=h password=*** port=x"),
        (f"host=h password='{_SECRET}' sslmode=bogus", "host=h password=*** sslmode=bogus"),
        (f"dbname=x password = {_SECRET} port=bad", "dbname=x password=*** port=bad"),
        (f"host=h password={_LOWER_SECRET}", "host=h password=***"),
        (f"token={_LOWER_SECRET}", "***=***"),
        (f"kafka:9092 password:{_LOWER_SECRET}", None),
        (f"host=h pass word={_LOWER_SECRET}", None),
        (f"app:{_LOWER_SECRET}", "app:***"),
    ],
    ids=[
        "keywords",
        "keywords-tab",
        "keywords-quoted",
        "keywords-spaced",
        "keywords-lowercase-password",
        "token-keyword",
        "name-colon",
        "keywords-broken",
        "user-colon-password",
    ],
)
def test_a_non_url_setting_never_echoes_a_password_in_its_value(
    monkeypatch: pytest.MonkeyPatch, value: str, shown: str | None
) -> None:
    """PIPELINE_KAFKA__BOOTSTRAP_SERVERS='host=h password=...': its password is ``***``."""
    line = config_line(monkeypatch, "PIPELINE_KAFKA__BOOTSTRAP_SERVERS", value)
    safe = _safe(line, _SECRET, _LOWER_SECRET)
    assert _SECRET not in line, safe
    assert _LOWER_SECRET not in line, safe
    got = f"{len(value)} characters, not shown" if shown is None else repr(shown)
    assert line.endswith(f" (got {got})"), safe


@pytest.mark.parametrize(
    "value",
    [f"{_SECRET}@x", f"a b {_SECRET}", _LOWER_SECRET + " x", "a@b"],
    ids=["at", "spaces", "lowercase", "no-secret"],
)
def test_a_setting_named_like_a_secret_never_echoes_its_value(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    """A bad role of a registry token (under *TOKEN*): no '(got ...)' at all, not even with '@'."""
    tokens = json.dumps([{"name": "ci", "token": "x", "role": value}])
    line = config_line(monkeypatch, "PIPELINE_REGISTRY__AUTH__TOKENS", tokens)
    assert line.startswith("invalid configuration: PIPELINE_REGISTRY__AUTH__TOKENS__0__ROLE: "), (
        _safe(line, _SECRET, _LOWER_SECRET)
    )
    assert "(got" not in line, _safe(line, _SECRET, _LOWER_SECRET)


@pytest.mark.parametrize(
    "value",
    [
        '{"sasl.password": 7391}',
        '{"sasl.password": ["SECRET"]}',
        '{"sasl.password": "SECRET"',
        '{"sasl.password": "SECRET",}',
        "{'sasl.password': 'SECRET'}",
        '{"sasl.username": "u", "sasl.password": "SECRET", "linger.ms": 5}',
        '{"ssl.key.password": "SECRET", "bootstrap.servers": ["SECRET@b:1"]}',
    ],
    ids=["number", "list", "unterminated", "trailing-comma", "single-quotes", "entry", "entry2"],
)
def test_a_bad_kafka_client_mapping_never_echoes_its_password(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    """PIPELINE_KAFKA__CLIENT='{"sasl.password": ...}': a bad JSON value or entry, no password."""
    value = value.replace("SECRET", _SECRET)
    line = config_line(monkeypatch, "PIPELINE_KAFKA__CLIENT", value)
    assert "PIPELINE_KAFKA__CLIENT" in line, _safe(line, _SECRET)
    assert _SECRET not in line, _safe(line, _SECRET)
    assert "7391" not in line, line


@pytest.mark.parametrize(
    ("variable", "value", "shown"),
    [
        ("PIPELINE_REDIS__URL", f"http://h/hooks/{_LOWER_SECRET}", "http://h/hooks/***"),
        ("PIPELINE_REGISTRY__URL", f"ftp://h:21/v1/a/{_LOWER_SECRET}/", "ftp://h:21/v1/***/***/"),
        ("PIPELINE_POSTGRES__URL", f"db:5432/x/{_LOWER_SECRET}", "db:5432/x/***"),
        ("PIPELINE_REGISTRY__URL", "ftp://h/orders", "ftp://h/orders"),
        ("PIPELINE_REDIS__URL", "redis://h:6379/abc", "redis://h:6379/abc"),
        ("PIPELINE_REDIS__URL", "redis://h:6379/x1y2z3w4v5u6t7s8", "redis://h:6379/***"),
        (
            "PIPELINE_REDIS__URL",
            "redis://h:6379/0?socket_timout=5",
            "redis://h:6379/0?socket_timout=***",
        ),
        (
            "PIPELINE_REDIS__URL",
            "unix:///run/redis/redis.sock?db=x",
            "unix:///run/redis/redis.sock?db=x",  # a setting, not a secret: shown
        ),
    ],
    ids=[
        "webhook-path",
        "registry-deep-path",
        "no-scheme",
        "first-segment-kept",
        "redis-database-a-short-word",
        "redis-database-a-token",
        "typo-option-named",
        "unix-socket-kept",
    ],
)
def test_a_url_settings_path_shows_only_its_first_segment(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str, shown: str
) -> None:
    """The database (or first path segment) is shown; a token deeper in the path is not."""
    line = config_line(monkeypatch, variable, value)
    assert _LOWER_SECRET not in line, _safe(line, _LOWER_SECRET)
    assert line.endswith(f" (got {shown!r})"), _safe(line, _LOWER_SECRET)


def test_plain_mistakes_are_still_echoed(monkeypatch: pytest.MonkeyPatch) -> None:
    """A typo with nothing secret-looking in it is what the operator needs to see."""
    cases = {
        "PIPELINE_TRANSPORT": "rabbitmq",
        "PIPELINE_KAFKA__BOOTSTRAP_SERVERS": "kafka1:9092,kafka2",
        "PIPELINE_RUNTIME__MAX_CONCURRENCY": "ten",
        "PIPELINE_MEMBERSHIP__INSTANCE": "pod/1",
    }
    for variable, value in cases.items():
        line = config_line(monkeypatch, variable, value)
        assert line.endswith(f" (got {value!r})"), line


# The fuzz: random secrets in every form a value can take, in every kind of setting.

_FIELD_SEPARATORS = ["=", " = ", "\t=\t", ":", ": ", "=\t"]
_SECRET_NAMES = [
    "password",
    "PASSWORD",
    "passwd",
    "pwd",
    "sslpassword",
    "secret",
    "client_secret",
    "token",
    "api_key",
    "apikey",
    "sasl.password",
    "auth",
    "credentials",
]
_URL_VARIABLES = ["PIPELINE_REDIS__URL", "PIPELINE_POSTGRES__URL", "PIPELINE_REGISTRY__URL"]
_OTHER_VARIABLES = [
    "PIPELINE_KAFKA__BOOTSTRAP_SERVERS",
    "PIPELINE_THROTTLE__NAMESPACE",
    "PIPELINE_MEMBERSHIP__INSTANCE",
    "PIPELINE_INGRESS__POSTGRES_SCHEMA",
    "PIPELINE_TRANSPORT",
    "PIPELINE_RUNTIME__MAX_CONCURRENCY",
]
# A key prefix is echoed as any plain setting now, but a pasted secret may land there too.
_SECRET_VARIABLES = ["PIPELINE_REDIS__KEY_PREFIX"]


def _secret(rng: random.Random) -> tuple[str, list[str]]:
    """A random secret and the pieces of it that must not show (each 6+ random letters).

    Lowercase pieces are the hard case (nothing marks them as a token); some are mixed case,
    and pieces are joined by characters URLs and keyword strings give meaning to.
    """
    pieces = []
    for _ in range(rng.randint(1, 3)):
        letters = (
            string.ascii_lowercase if rng.random() < 0.6 else string.ascii_letters + "0123456789"
        )
        pieces.append("".join(rng.choice(letters) for _ in range(rng.randint(6, 12))))
    joins = ["", "-", "_", ".", "@", "/", ":", "#", "?", "%", "&", "=", ",", "!", "$", "+"]
    secret = pieces[0]
    for piece in pieces[1:]:
        secret += rng.choice(joins) + piece
    return secret, pieces


def _forms(rng: random.Random, secret: str) -> list[str]:
    """``secret`` placed where a value may hold one: every form is one a user might write.

    Left out are the places shown by design: a host, the first path segment of a URL (the
    database, the bucket; a Redis one's when a short word), a keyword's value under a name that
    is no secret's (``user=...``) when it is a plain word.
    """
    name = rng.choice(_SECRET_NAMES)
    sep = rng.choice(_FIELD_SEPARATORS)
    quoted = "'" + secret.replace("\\", "\\\\").replace("'", "\\'") + "'"
    encoded = secret.replace("%", "%25").replace("@", "%40").replace("/", "%2F")
    host = rng.choice(["h", "db", "kafka-1.example.com", "10.0.0.7", "[::1]"])
    port = rng.choice(["6379", "5432", "9092", "x", "99999", ""])
    at = f"{host}:{port}" if port else host
    return [
        f"redis://:{secret}@{at}/0",
        f"redis://user:{secret}@{at}",
        f"rediss://user:{encoded}@{at}/0?ssl_cert_reqs=none",
        f"postgresql://app:{secret}@{at}/db?sslmode=bogus",
        f"postgres://app:{encoded}@{at}/db",
        f"http://ci:{secret}@{at}/",
        f"{secret}@redis://{at}/0",
        f"user:{secret}@{at}",
        f"{secret}@{at}",
        f"{at}/0?{name}={secret}",
        f"redis://{at}/0?a=1&{name}={secret}",
        f"redis://{at}/0?{secret}",
        f"redis://{at}/0#{secret}",
        f"http://{at}/hooks/{secret}",
        f"http://{at}/v1/{name}/{secret}",
        f"https://{at}/bucket/dir/{secret}?x=1",
        f"host={host} {name}{sep}{secret} port={port or 'x'}",
        f"host={host}\t{name}{sep}{quoted}\tsslmode=bogus",
        f"dbname=x {name} = {quoted}",
        f"{name}{sep}{secret}",
        f"{name}{sep}{quoted}",
        f"{at},{name}{sep}{secret}",
        f"{name} {secret}",
        f" {name}{sep}{secret}\n",
        f"{at}, {name} {secret} ",
        f"host={host} pass word={secret}",
        f'{{"{name}": "{secret}"}}',
    ] + (
        # user:password with no host; with an '@' in the password this is user:pw@host, what
        # follows its last '@' read (and shown) as the host, as in any user:password@host
        [f"user:{secret}", f"{host}:{secret}"] if "@" not in secret else []
    )


def _json_forms(rng: random.Random, secret: str) -> list[str]:
    """PIPELINE_KAFKA__CLIENT values: bad JSON or a bad entry, the secret under its key."""
    key = rng.choice(["sasl.password", "ssl.key.password", "sasl.oauthbearer.client.secret"])
    text = json.dumps(secret)
    return [
        f'{{"{key}": {text}',
        f'{{"{key}": {text},}}',
        f"{{'{key}': {text}}}",
        f'{{"{key}": [{text}]}}',
        f'{{"{key}": {{"value": {text}}}}}',
        f'{{"sasl.username": "u", "{key}": {text}, "linger.ms": 5}}',
        f'{{"{key}": {text}, "retries": [{text}]}}',
        f'{{"{key}" {text}}}',
    ]


_FUZZ_SEED = 20_261_207
_FUZZ_ROUNDS = 4


def test_fuzz_no_secret_ever_shows_in_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """Random secrets in every form, in URL, plain, secret-named and JSON settings: never shown.

    Each of a fixed seed's secrets is placed in each form and set in each kind of setting; the
    line must hold none of its pieces (case aside), and any other exception than ConfigError
    fails the test. About 270 settings are read.
    """
    rng = random.Random(_FUZZ_SEED)
    leaks: list[str] = []
    for round_ in range(_FUZZ_ROUNDS):
        secret, pieces = _secret(rng)
        cases = [(rng.choice(_URL_VARIABLES), form) for form in _forms(rng, secret)]
        cases += [(rng.choice(_OTHER_VARIABLES), form) for form in _forms(rng, secret)]
        cases += [(rng.choice(_SECRET_VARIABLES), form) for form in _forms(rng, secret)[::4]]
        cases += [("PIPELINE_KAFKA__CLIENT", form) for form in _json_forms(rng, secret)]
        for variable, value in cases:
            line = config_line(monkeypatch, variable, value)
            shown = [piece for piece in pieces if piece.lower() in line.lower()]
            if shown:
                safe = _safe(_safe(line, secret, *pieces), *(p.lower() for p in pieces))
                form = _safe(value, secret)
                leaks.append(f"round {round_}: {variable}={form!r} -> {safe}")
    assert not leaks, "\n".join(leaks)


def test_the_fuzz_reaches_every_kind_of_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fuzz means something: its values are refused, some echoed (***) and some by length."""
    rng = random.Random(_FUZZ_SEED)
    secret, _ = _secret(rng)
    lines = [config_line(monkeypatch, "PIPELINE_REDIS__URL", form) for form in _forms(rng, secret)]
    assert sum(line.startswith("invalid configuration") for line in lines) > len(lines) // 2
    assert any("***" in line for line in lines)
    assert any(re.search(r"\(got \d+ characters, not shown\)$", line) for line in lines)


@pytest.mark.parametrize(
    "url",
    [
        "rediss://127.0.0.1:6379/0?ssl_cert_reqs=Hunter2secretXYZ9",
        "rediss://127.0.0.1:6379/0?password=bogus",
        "redis://127.0.0.1:6379/0?client_name=bogus&socket_timeout=x",
    ],
)
def test_only_a_plain_word_given_to_a_setting_option_is_shown(url: str) -> None:
    """``ssl_cert_reqs=bogus`` is shown (the mistake); a token there, or a password, is not."""
    shown = shown_url(url)
    assert shown is not None
    assert "Hunter2secretXYZ9" not in shown
    assert "password=bogus" not in shown
    assert "client_name=bogus" not in shown
    assert shown_url("rediss://h:6379/0?ssl_cert_reqs=bogus") == (
        "rediss://h:6379/0?ssl_cert_reqs=bogus"
    )
