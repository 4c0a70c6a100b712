"""Commands: ``registry serve`` and ``schemas push/check/ls``.

``app`` (to mount as ``pipeline registry``) runs the server; ``schemas_app`` (to mount as
``pipeline schemas``) manages ``schemas/*.avsc`` against a running registry. Each schema file is
registered under the full name of its top-level type (``pipeline.events.MessageReceived``: the
record-name subject strategy), or under the file's stem for an unnamed type. Settings come from
``PIPELINE_REGISTRY__*`` (see :mod:`pipeline.registry.settings`), options override them. Errors
print one line to stderr: exit 1 for a failed operation or an incompatible schema, 2 for bad
input or configuration.

The server, the client, the stores and the settings are imported when a command runs, not when
``pipeline`` registers the commands.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from pipeline.cli_support import HELP_MARKUP, out_console, require_listenable
from pipeline.errors import ConfigError, PipelineError
from pipeline.registry.errors import InvalidSchema, SchemaNotFound, SubjectNotFound
from pipeline.startup import start_standalone

if TYPE_CHECKING:
    from pipeline.config import RegistrySettings
    from pipeline.registry.canonical import ParsedSchema
    from pipeline.registry.client.http import RegistryClient

T = TypeVar("T")
app = typer.Typer(help="The schema registry server.", no_args_is_help=True)
schemas_app = typer.Typer(help="Register and check schemas/*.avsc.", no_args_is_help=True)
err = Console(stderr=True, soft_wrap=True, emoji=False)

UrlOpt = Annotated[
    str | None, typer.Option("--url", help="Registry URL (default: PIPELINE_REGISTRY__URL).")
]
DirArg = Annotated[Path, typer.Argument(help="Folder of *.avsc files.")]


def _fail(message: str, code: int) -> typer.Exit:
    err.print(f"[red]error:[/red] {escape(str(message))}", highlight=False)
    return typer.Exit(code)


def _guard(fn: Callable[[], T]) -> T:
    try:
        return fn()
    except (ConfigError, InvalidSchema) as exc:
        raise _fail(str(exc), 2) from None
    except PipelineError as exc:
        raise _fail(str(exc), 1) from None


@app.command()
def serve(
    host: Annotated[str | None, typer.Option(help="Interface (default 127.0.0.1).")] = None,
    port: Annotated[int | None, typer.Option(help="Port (default 8081; 0 picks one).")] = None,
    store: Annotated[
        str | None, typer.Option(help="sqlite:///path or postgresql://... (default sqlite).")
    ] = None,
    compatibility: Annotated[
        str | None, typer.Option(help="Default compatibility level (default BACKWARD).")
    ] = None,
) -> None:
    """Serve the Confluent-compatible registry API until interrupted."""
    from pipeline.reachability import safe_url  # noqa: PLC0415 - see the module doc
    from pipeline.registry.server.api import create_app  # noqa: PLC0415
    from pipeline.registry.server.serve import serve as serve_app  # noqa: PLC0415
    from pipeline.registry.server.service import Registry  # noqa: PLC0415
    from pipeline.registry.settings import load_registry_settings, startup_problem  # noqa: PLC0415
    from pipeline.registry.stores.protocol import open_store  # noqa: PLC0415

    given = {"host": host, "port": port, "store": store, "default_compatibility": compatibility}
    settings = _guard(lambda: load_registry_settings(**{k: v for k, v in given.items() if v}))
    if port == 0:
        settings = settings.model_copy(update={"port": 0})
    problem = startup_problem(settings)
    if problem is not None:
        raise _fail(problem, 2)
    _guard(
        lambda: require_listenable(
            settings.host,
            settings.port,
            variable="PIPELINE_REGISTRY__PORT (or --port)",
            host_variable="PIPELINE_REGISTRY__HOST (or --host)",
        )
    )
    backing = _guard(lambda: open_store(settings.store, pool_max=settings.pool_max))
    registry = Registry(backing, default_compatibility=settings.default_compatibility)
    application = create_app(
        backing, registry=registry, auth=settings.auth, max_body_bytes=settings.max_body_bytes
    )

    def ready(bound: int) -> None:
        typer.echo(
            f"registry listening on http://{settings.host}:{bound} "
            f"(store {safe_url(settings.store)}, auth {'on' if settings.auth.enabled else 'off'})"
        )
        sys.stdout.flush()

    try:
        stopped_by = serve_app(application, settings.host, settings.port, ready)
    finally:
        backing.close()
    if stopped_by is not None:  # a clean stop: exit 0, not killed by the signal again
        typer.echo(f"registry stopped on {stopped_by.name}")


def _client(url: str | None) -> tuple[RegistryClient, RegistrySettings]:
    from pipeline.reachability import checked_http_url  # noqa: PLC0415 - see the module doc
    from pipeline.registry.client.http import RegistryClient  # noqa: PLC0415
    from pipeline.registry.settings import load_registry_settings  # noqa: PLC0415

    if url:  # checked as the option it is, before the settings would name their variable
        _guard(lambda: checked_http_url(url, "--url"))
    settings = _guard(lambda: load_registry_settings(**({"url": url} if url else {})))
    if url:  # a registry that does not answer is named by the option that gave its URL
        return RegistryClient.from_settings(settings, named_by="--url"), settings
    return RegistryClient.from_settings(settings), settings


def _load(directory: Path) -> list[tuple[Path, str, ParsedSchema]]:
    from pipeline.registry.canonical import parse  # noqa: PLC0415 - see the module doc

    files = sorted(directory.glob("*.avsc"))
    if not files:
        raise _fail(f"no *.avsc files in {directory}", 2)
    loaded = []
    for path in files:
        try:
            # The operator's own files, unbounded: the registry bounds what clients send, and
            # says whether it already holds a schema whose defaults pass the bound.
            parsed = parse(path.read_text(encoding="utf-8"), bounded=False)
        except OSError as exc:  # a directory named *.avsc, no permission
            raise _fail(f"{path}: cannot read the schema file: {exc.strerror}", 2) from None
        except UnicodeDecodeError as exc:
            raise _fail(f"{path}: not UTF-8 text: {exc.reason}; save it as UTF-8", 2) from None
        except InvalidSchema as exc:
            raise _fail(f"{path}: {exc}", 2) from None
        tree: Any = parsed.tree
        subject = tree["name"] if isinstance(tree, dict) and "name" in tree else path.stem
        loaded.append((path, subject, parsed))
    return loaded


def _plan(client: RegistryClient, subject: str, parsed: ParsedSchema) -> tuple[str, list[str]]:
    """("unchanged" | "new subject" | "new version" | "incompatible", problems)."""
    try:
        client.lookup(subject, parsed.normalized)
    except SubjectNotFound:
        return "new subject", []
    except SchemaNotFound:
        problems = client.compatibility_problems(subject, parsed.normalized)
        return ("incompatible" if problems else "new version"), problems
    return "unchanged", []


@schemas_app.command()
def push(
    directory: DirArg = Path("schemas"),
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Show what would change.")] = False,
    url: UrlOpt = None,
) -> None:
    """Register every schema file under its subject (idempotent); exit 1 if one is refused."""
    client, _ = _client(url)
    failed = 0
    try:
        for path, subject, parsed in _load(directory):
            state, problems = _guard(partial(_plan, client, subject, parsed))
            if state == "incompatible":
                failed += 1
                err.print(escape(f"{path.name}: {subject}: incompatible"), highlight=False)
                for problem in problems:  # a default's text, a subject: rich would read [..]
                    err.print(escape(f"  {problem}"), highlight=False)
            elif dry_run:
                typer.echo(f"(dry run) {path.name}: {subject}: {state}")
            else:
                schema_id = _guard(partial(client.register, subject, parsed.normalized))
                typer.echo(f"{path.name}: {subject}: {state}, id {schema_id}")
    finally:
        client.close()
    if failed:
        raise typer.Exit(1)


@schemas_app.command()
def check(directory: DirArg = Path("schemas"), url: UrlOpt = None) -> None:
    """Check every schema file against its subject; exit 1 on an incompatible change."""
    client, _ = _client(url)
    failed = 0
    try:
        for path, subject, parsed in _load(directory):
            state, problems = _guard(partial(_plan, client, subject, parsed))
            typer.echo(f"{path.name}: {subject}: {state}")
            for problem in problems:
                typer.echo(f"  {problem}")
            failed += state == "incompatible"
    finally:
        client.close()
    if failed:
        raise typer.Exit(1)


@schemas_app.command("ls")
def list_subjects(
    url: UrlOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per subject.")] = False,
) -> None:
    """List subjects with their latest version and schema id."""
    client, settings = _client(url)
    try:
        rows = [_guard(partial(client.latest, s)) for s in _guard(client.subjects)]
    finally:
        client.close()
    if as_json:
        for r in rows:
            typer.echo(json.dumps({"subject": r.subject, "version": r.version, "id": r.schema_id}))
        return
    from pipeline.reachability import safe_url  # noqa: PLC0415 - see the module doc

    # As text: rich would read an IPv6 host ("[fd00::5]") as a style and drop it from the title.
    title = Text(f"subjects at {safe_url(settings.url)}")
    table = Table("subject", "latest version", "id", title=title)
    for r in rows:
        table.add_row(Text(r.subject), str(r.version), str(r.schema_id))  # as registered
    out_console().print(table)


def standalone() -> typer.Typer:
    """Both command groups under one root, as ``pipeline`` will mount them."""
    root = typer.Typer(
        no_args_is_help=True, pretty_exceptions_enable=False, rich_markup_mode=HELP_MARKUP
    )
    root.add_typer(app, name="registry")
    root.add_typer(schemas_app, name="schemas")
    return root


def main() -> None:
    """Entry point for ``python -m pipeline.registry``; logging and the open-file limit first.

    Logging as ``pipeline``'s (``PIPELINE_LOG_LEVEL``, ``PIPELINE_LOG_FORMAT``), so a refused
    raise of the limit is a formatted line, logged by the server only (``registry serve``).
    """
    start_standalone(sys.argv[1:])
    standalone()()
