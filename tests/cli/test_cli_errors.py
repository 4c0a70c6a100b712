"""Bad input to a command is one line naming the option, file or variable, and exit 2.

Every service the commands would reach is pointed at a closed loopback port: a usage error must
be reported before any service is asked, and nothing is written anywhere.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from support import run_pipeline

ROOT = Path(__file__).resolve().parents[2]
TOPICS = str(ROOT / "topics")
DOWN = {
    "PIPELINE_REDIS__URL": "redis://127.0.0.1:1/0",
    "PIPELINE_KAFKA__BOOTSTRAP_SERVERS": "127.0.0.1:1",
    "PIPELINE_REGISTRY__URL": "http://127.0.0.1:1",
    "PIPELINE_TOPICS_DIR": TOPICS,
}
"""Every service on a closed port, and the project's declarations."""


def pipeline(
    *args: str, env: dict[str, str] | None = None, cwd: Path = ROOT
) -> subprocess.CompletedProcess[str]:
    """Run ``pipeline ARGS`` in ``cwd`` with the services down and ``env`` added."""
    return run_pipeline(*args, env={**os.environ, **DOWN, **(env or {})}, cwd=cwd)


def assert_one_line(result: subprocess.CompletedProcess[str], code: int, *named: str) -> str:
    """Exit ``code``, no traceback, one stderr line, an error naming every one of ``named``."""
    assert result.returncode == code, result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: "), lines[0]
    for text in named:
        assert text in lines[0], lines[0]
    return lines[0]


# pipeline send: an ingress URL that is not one is bad input, not an ingress that is down.

SECRETS = {"META_APP_SECRET": "x", "META_VERIFY_TOKEN": "x", "GITHUB_WEBHOOK_SECRET": "x"}
WEBHOOK = str(ROOT / "deploy/local/webhooks/whatsapp-message.json")


def send(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> str:
    """Run ``pipeline send whatsapp`` with the example sources; expect one line and exit 2."""
    (tmp_path / "sources.yaml").write_text(
        (ROOT / "deploy/local/sources.example.yaml").read_text(encoding="utf-8")
    )
    result = pipeline(
        "send", "whatsapp", "--file", WEBHOOK, *args, env={**SECRETS, **(env or {})}, cwd=tmp_path
    )
    return assert_one_line(result, 2)


@pytest.mark.parametrize(
    "url",
    [
        "http://[::1",
        "http://127.0.0.1:99999",
        "http://127.0.0.1:0",
        "http://127.0.0.1:port",
        "http://",
        "notaurl",
        "ftp://x",
    ],
)
def test_send_to_a_url_that_is_not_one_names_the_option(tmp_path: Path, url: str) -> None:
    """`send --url` with no http(s) URL in it is a usage error naming --url, not an outage."""
    line = send(tmp_path, "--url", url)
    assert "--url" in line
    assert "cannot reach" not in line


@pytest.mark.parametrize("host", ["[::1", "a:b:c", "::1"])
def test_send_to_an_ingress_host_no_url_can_hold_names_the_variable(
    tmp_path: Path, host: str
) -> None:
    """The default address from PIPELINE_INGRESS__HOST and __PORT is checked the same way."""
    line = send(tmp_path, env={"PIPELINE_INGRESS__HOST": host})
    assert "PIPELINE_INGRESS__HOST" in line
    assert "--url" in line  # how to give the address instead


def test_send_with_a_url_keeps_the_password_out_of_the_error(tmp_path: Path) -> None:
    """A URL refused for its port is shown without the password it carries."""
    line = send(tmp_path, "--url", "http://user:hunter2@127.0.0.1:99999")
    assert "hunter2" not in line


# pipeline schemas ls / check / push: the registry URL.


@pytest.mark.parametrize("command", [["ls"], ["check", "schemas"], ["push", "--dry-run"]])
def test_schemas_with_a_registry_url_that_is_not_one_names_the_option(
    command: list[str],
) -> None:
    """`schemas ... --url 'http://[::1'` is one line naming --url, exit 2."""
    assert_one_line(pipeline("schemas", *command, "--url", "http://[::1"), 2, "--url")


def test_schemas_with_a_registry_variable_that_is_not_a_url_names_it() -> None:
    """The same URL from PIPELINE_REGISTRY__URL names the variable and hides the password."""
    result = pipeline("schemas", "ls", env={"PIPELINE_REGISTRY__URL": "http://u:hunter2@[::1"})
    line = assert_one_line(result, 2, "PIPELINE_REGISTRY__URL")
    assert "hunter2" not in line


@pytest.mark.parametrize("command", [["check"], ["push", "--dry-run"]])
@pytest.mark.parametrize(
    ("make", "problem"),
    [
        (lambda path: path.write_bytes(b'{"type": "string", "doc": "\xff"}'), "not UTF-8"),
        (lambda path: path.mkdir(), "Is a directory"),
    ],
)
def test_schemas_with_a_schema_file_it_cannot_read_names_the_file(
    tmp_path: Path, command: list[str], make: Callable[[Path], object], problem: str
) -> None:
    """A ``.avsc`` that is not UTF-8 or is a directory is one line naming the file, exit 2."""
    make(tmp_path / "broken.avsc")
    result = pipeline("schemas", *command, str(tmp_path))
    assert_one_line(result, 2, str(tmp_path / "broken.avsc"), problem)


# pipeline registry serve and ingress serve: the address to listen on.


@pytest.mark.parametrize(
    ("host", "named"),
    [
        ("a..b", "'a..b'"),
        ("x" * 300, "PIPELINE_REGISTRY__HOST (or --host)"),
        ("nosuch.invalid", "cannot resolve the host name 'nosuch.invalid'"),
        (b"a\xffb".decode(errors="surrogateescape"), "'a\\xffb'"),
    ],
)
def test_registry_serve_on_a_host_it_cannot_listen_on_names_it(
    tmp_path: Path, host: str, named: str
) -> None:
    """`registry serve --host` that no socket can bind is one line naming the host, exit 2."""
    store = f"sqlite:///{tmp_path}/registry.db"
    result = pipeline("registry", "serve", "--host", host, "--port", "0", "--store", store)
    assert_one_line(result, 2, "cannot listen on", named)
    assert not (tmp_path / "registry.db").exists()


def test_ingress_serve_on_a_host_not_utf8_names_it(tmp_path: Path) -> None:
    """`ingress serve --host` with bytes that are not UTF-8 is one line naming it, exit 2."""
    (tmp_path / "sources.yaml").write_text(
        (ROOT / "deploy/local/sources.example.yaml").read_text(encoding="utf-8")
    )
    host = b"a\xffb".decode(errors="surrogateescape")
    env = {**SECRETS, "PIPELINE_INGRESS__SQLITE_PATH": str(tmp_path / "ingress.db")}
    result = pipeline("ingress", "serve", "--host", host, "--port", "0", env=env, cwd=tmp_path)
    assert_one_line(result, 2, "--host 'a\\xffb'")


# pipeline asyncapi: its schemas, apps and groups.


@pytest.mark.parametrize(
    ("text", "problem"),
    [('{"type": "record",', "not valid JSON"), ("[1, 2]", "expected a JSON object")],
)
def test_asyncapi_with_a_schema_file_it_cannot_read_names_the_file(
    tmp_path: Path, text: str, problem: str
) -> None:
    """A malformed or non-record ``.avsc`` under --schemas is one line naming the file, exit 2."""
    (tmp_path / "broken.avsc").write_text(text)
    result = pipeline("asyncapi", "--schemas", str(tmp_path))
    assert_one_line(result, 2, str(tmp_path / "broken.avsc"), problem)


def test_asyncapi_refuses_a_schemas_directory_that_is_not_there(tmp_path: Path) -> None:
    """`--schemas DIR` given but missing is refused: its Avro payloads would silently go."""
    missing = tmp_path / "nonexistent"
    assert_one_line(pipeline("asyncapi", "--schemas", str(missing)), 2, "--schemas", str(missing))


def test_asyncapi_without_schemas_needs_no_schemas_directory(tmp_path: Path) -> None:
    """Without --schemas a directory with no schemas/ still gets its document."""
    result = pipeline("asyncapi", "--format", "json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize(
    ("group", "named"),
    [("messages=", "--group 'messages='"), ("bad", "--group 'bad'"), ("nosuch=x", "'nosuch'")],
)
def test_asyncapi_refuses_a_group_it_cannot_use(group: str, named: str) -> None:
    """--group takes LANE=GROUP with a declared lane and a group name; anything else is exit 2."""
    assert_one_line(pipeline("asyncapi", "--group", group), 2, named)


def test_asyncapi_takes_a_group_for_a_declared_lane() -> None:
    """--group messages=replies names the messages lane's consumer group."""
    result = pipeline("asyncapi", "--format", "json", "--group", "messages=replies")
    assert result.returncode == 0, result.stderr
    assert '"enum": [\n              "replies"\n' in result.stdout


@pytest.mark.parametrize("command", [["topics", "apply"], ["asyncapi"]])
def test_the_declarations_default_is_said_to_be_pipeline_topics_dir(command: list[str]) -> None:
    """The [DIRECTORY] argument's help names PIPELINE_TOPICS_DIR, the default it really has."""
    result = pipeline(*command, "--help", env={"COLUMNS": "200"})
    assert result.returncode == 0, result.stderr
    assert "default: PIPELINE_TOPICS_DIR" in result.stdout


# An app module that fails when imported.

BROKEN_MODULES = {
    "raises": ('raise RuntimeError("no API key at import")\n', "RuntimeError: no API key"),
    "syntax": ("def handle(:\n", "SyntaxError"),
}


@pytest.mark.parametrize("module", sorted(BROKEN_MODULES))
@pytest.mark.parametrize(
    "command", [["asyncapi", "--app"], ["consume", "-g", "g", "-t", "kafka"]], ids=str
)
def test_an_app_module_that_fails_at_import_is_one_line(
    tmp_path: Path, module: str, command: list[str]
) -> None:
    """`--app mod:app` or `consume mod:app` whose module raises names the module and the error."""
    source, named = BROKEN_MODULES[module]
    (tmp_path / f"{module}_app.py").write_text(source)
    if command[0] == "consume":
        args = ["consume", f"{module}_app:app", *command[1:]]
    else:
        args = [*command, f"{module}_app:app"]
    result = pipeline(*args, cwd=tmp_path)
    assert_one_line(result, 2, f"'{module}_app'", named)


# pipeline consume: what it is asked to run is checked before any service is reached.


@pytest.mark.parametrize("transport", ["kafka", "redis"])
@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["bad"], "MODULE:APP"),
        (["nosuch_module:app"], "'nosuch_module'"),
        (["consumers.messages:nosuch"], "'consumers.messages' has no attribute 'nosuch'"),
        (["consumers.messages:app", "-l", "nosuchlane"], "--lane"),
        (["consumers.messages:app", "--instance", "bad name"], "--instance 'bad name'"),
    ],
)
def test_consume_says_what_is_wrong_with_its_arguments_before_reaching_a_service(
    transport: str, args: list[str], named: str
) -> None:
    """With every service down, a bad app, lane or instance is still exit 2 naming it."""
    result = pipeline("consume", *args, "-g", "g", "-t", transport)
    line = assert_one_line(result, 2, named)
    assert "cannot reach" not in line


@pytest.mark.parametrize(
    ("group", "named"),
    [
        ("", "--group ''"),
        ("  ", "--group '  '"),
        (b"a\xffb".decode(errors="surrogateescape"), "'a\\xffb'"),
    ],
)
def test_consume_refuses_a_group_no_member_should_join(group: str, named: str) -> None:
    """An empty --group (an unset variable) or one not UTF-8 is exit 2 naming it, no member runs."""
    result = pipeline("consume", "consumers.messages:app", "-g", group, "-t", "redis")
    line = assert_one_line(result, 2, named)
    assert "cannot reach" not in line


# pipeline redrive: its times.


@pytest.mark.parametrize(
    ("option", "value"),
    [("--since", "abc"), ("--until", "yesterday"), ("--since", "1" + "0" * 400 + "d")],
)
def test_redrive_names_the_time_option_it_cannot_read(option: str, value: str) -> None:
    """A --since or --until that is no time, or an age past any clock, is one line naming it."""
    result = pipeline("redrive", "messages.dlq", option, value, "--dry-run")
    assert_one_line(result, 2, f"{option}: ")


# pipeline capacity: the declarations it reads.


def test_capacity_with_no_topic_directory_is_exit_2() -> None:
    """A PIPELINE_TOPICS_DIR that is not there is configuration: exit 2, as other commands."""
    result = pipeline("capacity", "messages", env={"PIPELINE_TOPICS_DIR": "/nonexistent"})
    assert_one_line(result, 2, "/nonexistent", "PIPELINE_TOPICS_DIR")


def test_capacity_with_an_invalid_declaration_names_the_file(tmp_path: Path) -> None:
    """A declaration that is no YAML is exit 2, naming its file."""
    (tmp_path / "broken.yaml").write_text("name: [\n")
    result = pipeline("capacity", "messages", env={"PIPELINE_TOPICS_DIR": str(tmp_path)})
    assert_one_line(result, 2, str(tmp_path / "broken.yaml"))


# Options are held to what their variables are held to.


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["throttle", "set-limit", "org:a", "2", "-n", "bad ns"], "--namespace"),
        (["throttle", "set-reserve", "org:a", "2", "--namespace", "a/b"], "--namespace"),
        (["throttle", "status", "-n", "bad ns"], "--namespace"),
        (["consume", "consumers.messages:app", "-g", "g", "-c", "20000"], "--concurrency"),
    ],
)
def test_an_option_is_validated_as_its_variable_is(args: list[str], named: str) -> None:
    """A value the setting's variable could not hold is refused as the option, before Redis."""
    line = assert_one_line(pipeline(*args), 2, named)
    assert "cannot reach" not in line


@pytest.mark.parametrize(
    ("variable", "value"), [("PIPELINE_LOG_LEVEL", "verbose"), ("PIPELINE_LOG_FORMAT", "jsonl")]
)
def test_a_log_variable_with_a_value_it_cannot_take_is_one_line(variable: str, value: str) -> None:
    """A log level or format that is not one is refused by name, not a traceback or ignored."""
    result = pipeline("topics", "list", env={variable: value})
    assert_one_line(result, 2, variable, repr(value))


@pytest.mark.parametrize(
    ("variable", "example"),
    [
        ("PIPELINE_KAFKA__CLIENT", '{"fetch.wait.max.ms": "50"}'),
        ("PIPELINE_RUNTIME__PRESSURE", '{"enabled": true}'),
        ("PIPELINE_INGRESS__SWEEPER__LANE_GROUPS", '{"messages": "messages"}'),
    ],
)
def test_a_json_variable_that_is_not_json_is_shown_an_example_of_its_own(
    variable: str, example: str
) -> None:
    """The example in the error is one the variable itself takes, not another's."""
    result = pipeline("topics", "list", env={variable: "off"})
    line = assert_one_line(result, 2, f"{variable}: not valid JSON")
    assert example in line
