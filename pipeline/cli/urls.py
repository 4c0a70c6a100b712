"""HTTP addresses given to the command line, checked before any request is made.

``pipeline send`` posts to the ingress and ``pipeline schemas`` asks the registry over HTTP; an
address that is no ``http(s)://host:port`` URL (``http://[::1``, port 99999, ``ftp://x``) is a
usage error: one line naming the option or variable it came from, exit 2, instead of a
traceback from the HTTP client or an "unreachable" that sends its reader to start a service.
"""

from __future__ import annotations

import copy
import functools
import inspect
import re
from collections.abc import Callable
from typing import Any, TypeVar
from urllib.parse import urlsplit

import httpx
import typer
from rich.markup import escape

from pipeline.cli_support import err
from pipeline.config import ENV_PREFIX, load_settings
from pipeline.errors import ConfigError
from pipeline.reachability import REGISTRY_VARIABLE
from pipeline.registry.settings import load_registry_settings

__all__ = [
    "checked_http_url",
    "http_url_problem",
    "ingress_url_checked",
    "registry_url_checked",
    "registry_urls_checked",
]

F = TypeVar("F", bound=Callable[..., Any])

_MAX_PORT = 65_535
_USERINFO = re.compile(r"(?<=//)[^/?#]*@")


def _shown(url: str) -> str:
    """``url`` fit to print: whatever precedes an ``@`` of its authority is ``***``."""
    return _USERINFO.sub("***@", url)


def http_url_problem(url: str) -> str | None:
    """Why ``url`` is not an ``http://`` or ``https://`` URL with a host and a usable port."""
    try:
        parts = urlsplit(url)
        port = parts.port  # raises for a port that is no number or out of range
    except ValueError as exc:
        return str(exc)
    if parts.scheme not in {"http", "https"}:
        return "expected http://host:port or https://host:port"
    if not parts.hostname:
        return "no host"
    if port == 0:
        return f"port 0 is not one to connect to (1-{_MAX_PORT})"
    try:
        httpx.URL(url)
    except httpx.InvalidURL as exc:
        return str(exc)
    return None


def checked_http_url(url: str, source: str) -> str:
    """``url`` when :func:`http_url_problem` finds nothing, else ConfigError naming ``source``.

    ``source`` is the option or variable the URL came from (``--url``).
    """
    problem = http_url_problem(url)
    if problem is not None:
        raise ConfigError(f"{source} {_shown(url)!r} is not an http(s) URL: {problem}")
    return url


def _refused(exc: ConfigError) -> typer.Exit:
    err.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False)
    return typer.Exit(2)


def ingress_url_checked(command: F) -> F:
    """``pipeline send`` refusing a ``--url``, or a default ingress address, that is no URL.

    The default is ``http://PIPELINE_INGRESS__HOST:PIPELINE_INGRESS__PORT``, as the command
    builds it; settings it cannot load are left to the command, which reports them.
    """
    return _url_checked(command, _check_default_ingress)


def _check_default_ingress() -> None:
    try:
        ingress = load_settings().ingress
    except ConfigError:
        return
    default = f"http://{ingress.host}:{ingress.port}"
    problem = http_url_problem(default)
    if problem is not None:
        raise ConfigError(
            f"{ENV_PREFIX}INGRESS__HOST {ingress.host!r} and __PORT {ingress.port} make "
            f"{default!r}, not an http URL ({problem}); set them to the ingress's address, "
            "or give it with --url http://HOST:PORT (an IPv6 address in brackets)"
        )


def registry_url_checked(command: F) -> F:
    """A ``pipeline schemas`` command refusing a registry URL that is no URL.

    Commands without a ``url`` parameter are returned as they are. Without ``--url`` the
    command's ``PIPELINE_REGISTRY__URL`` is checked; settings it cannot load are left to it.
    """
    if "url" not in inspect.signature(command).parameters:
        return command

    return _url_checked(command, _check_default_registry)


def _url_checked(command: F, check_default: Callable[[], None]) -> F:
    """``command`` checking its ``--url`` (or, without one, ``check_default()``) first."""

    @functools.wraps(command)
    def checked(*args: Any, **kwargs: Any) -> Any:
        url = kwargs.get("url")
        try:
            if url:
                checked_http_url(url, "--url")
            else:
                check_default()
        except ConfigError as exc:
            raise _refused(exc) from None
        return command(*args, **kwargs)

    return checked  # type: ignore[return-value]


def _check_default_registry() -> None:
    try:
        url = load_registry_settings().url
    except ConfigError:
        return
    checked_http_url(url, REGISTRY_VARIABLE)


def registry_urls_checked(group: typer.Typer) -> typer.Typer:
    """A copy of ``group`` whose commands refuse a registry URL that is no URL.

    ``group`` itself is left as it is (``python -m pipeline.registry`` mounts it unchanged).
    """
    checked = copy.copy(group)
    checked.registered_commands = []
    for info in group.registered_commands:
        command = copy.copy(info)
        if info.callback is not None:
            command.callback = registry_url_checked(info.callback)
        checked.registered_commands.append(command)
    return checked
