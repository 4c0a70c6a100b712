"""What the command line imports before a command runs: only what its --help needs."""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = (
    # clients, servers and codecs a command opens when it runs, not when it is listed
    "confluent_kafka",
    "fastavro",
    "httpx",
    "opentelemetry",
    "psycopg",
    "pydantic",
    "pydantic_settings",
    "redis",
    "starlette",
    "uvicorn",
    "uvloop",
    "yaml",
    # the stages behind the commands, and the settings (which import redis and pydantic)
    "pipeline.config",
    "pipeline.ingress.service",
    "pipeline.registry.server",
    "pipeline.runtime",
    "pipeline.topics",
    "pipeline.transport.kafka",
    "pipeline.transport.redis_streams",
)


def _imported_after(code: str, heavy: tuple[str, ...] = HEAVY) -> list[str]:
    """The modules of ``heavy`` (or inside them) loaded once ``code`` has run."""
    probe = (
        f"{code}\n"
        "import json, sys\n"
        f"heavy = {heavy!r}\n"
        "print(json.dumps(sorted(m for m in sys.modules"
        " if any(m == h or m.startswith(h + '.') for h in heavy))))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    return list(json.loads(out.stdout))


def test_importing_the_cli_loads_no_command_stack() -> None:
    """Importing pipeline.cli loads no client, server, settings or stage a command runs on."""
    assert _imported_after("import pipeline.cli") == []


def test_help_of_every_command_loads_no_command_stack() -> None:
    """Printing the help of the root and of every command group loads none of them either.

    (Typer itself imports pydantic to build a command's options.)
    """
    code = (
        "import contextlib, io\n"
        "from pipeline.cli import app\n"
        "for args in ([], ['topics'], ['throttle'], ['ingress'], ['registry'], ['schemas'],"
        " ['offload'], ['status'], ['tail'], ['send'], ['replay'], ['consume']):\n"
        "    with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
        "        app([*args, '--help'])\n"
    )
    assert _imported_after(code, tuple(m for m in HEAVY if m != "pydantic")) == []
