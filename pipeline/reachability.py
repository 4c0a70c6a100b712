"""The one line a command prints when a service does not answer: what, where, why, what to do.

Every command that reaches Kafka, Redis or the schema registry says it the same way:
``cannot reach Redis at redis://127.0.0.1:6379/0 (PIPELINE_REDIS__URL): <reason>; start it
(`make services`) or point PIPELINE_REDIS__URL at a running one``. A Redis that refuses the
URL's credentials or whose TLS handshake fails runs: its line says what to change in the URL
instead. So does a ``rediss://`` address whose TLS handshake timed out or failed without a word
at a port that speaks plain text (a plain Redis, asked over TLS, never answers the handshake):
asked of the port once, only then, so a host that is really down keeps the line above. Passwords
in URLs are replaced by ``***``; of ``PIPELINE_KAFKA__CLIENT`` only the keys are shown.
"""

from __future__ import annotations

import errno
import re
import socket
from typing import Literal
from urllib.parse import SplitResult, urlsplit, urlunsplit

from pipeline.config import ENV_PREFIX, Settings, hide_credentials, http_url_problem
from pipeline.errors import ConfigError

__all__ = [
    "REGISTRY_VARIABLE",
    "Service",
    "checked_http_url",
    "how_to_fix",
    "listen_error",
    "named_with_fix",
    "no_answer",
    "refusal",
    "require_listenable",
    "safe_url",
    "unreachable",
    "unreachable_at",
    "where",
]

Service = Literal["kafka", "redis"]
REGISTRY_VARIABLE = f"{ENV_PREFIX}REGISTRY__URL"
"""The variable that says where the schema registry's clients find it."""

START = "`make services`"
"""How the local services are started."""
_NAMES: dict[Service, str] = {"kafka": "Kafka", "redis": "Redis"}


_USERINFO = re.compile(r"(?<=//)[^/?#]*@")


def checked_http_url(url: str, source: str) -> str:
    """``url`` when it is an http(s) URL with a host and a port to use, else ConfigError.

    ``source`` is the option or variable it came from (``--url``), named in the error; a URL
    too malformed to parse still has whatever precedes the ``@`` of its authority hidden.
    """
    problem = http_url_problem(url)
    if problem is not None:
        shown = hide_credentials(_USERINFO.sub("***@", url), url)
        said = hide_credentials(problem, url)
        raise ConfigError(f"{source} {shown!r} is not an http(s) URL: {said}")
    return url


_QUERY_PASSWORD = re.compile(r"(?<=[?&;])(password=).*", re.IGNORECASE | re.DOTALL)


def safe_url(url: str) -> str:
    """``url`` without its password (in its authority, or a ``password=`` option), fit to print.

    A password with a ``/``, ``?`` or ``#`` left unencoded is no password to ``urlsplit`` (it
    ends the authority there): whatever remains of it is hidden by :func:`hide_credentials`.
    A ``password=`` option hides all that follows it, the fragment included: a ``&``, ``;`` or
    ``#`` left unencoded in its value would have the rest of it printed as another option or
    as the fragment.
    """
    parts = urlsplit(url)
    in_query = _QUERY_PASSWORD.search("?" + parts.query) is not None
    if parts.password is None and not in_query:
        return hide_credentials(url, url)  # as given: urlunsplit would drop sqlite:///'s "//"
    if in_query:
        query = _QUERY_PASSWORD.sub(r"\1***", "?" + parts.query)[1:]
        parts = parts._replace(query=query, fragment="")
    if parts.password is not None:
        netloc = parts.netloc.rsplit("@", 1)[1]
        user = parts.username or ""
        parts = parts._replace(netloc=f"{user}:***@{netloc}" if user else f"***@{netloc}")
    return hide_credentials(urlunsplit(parts), url)


def where(settings: Settings, service: Service) -> tuple[str, str]:
    """The address of ``service`` and the variable that sets it."""
    if service == "kafka":
        return settings.kafka.bootstrap_servers, f"{ENV_PREFIX}KAFKA__BOOTSTRAP_SERVERS"
    return safe_url(settings.redis.url), f"{ENV_PREFIX}REDIS__URL"


def how_to_fix(variable: str, start: str = START, instead: str = "a running one") -> str:
    """What to do about a service that does not answer: start it, or point ``variable`` away."""
    return f"start it ({start}) or point {variable} at {instead}"


def named_with_fix(
    settings: Settings, service: Service, instead: str = "a running one", reason: str = ""
) -> str:
    """``service``, its address and variable, and the fix: to follow an error that lacks them.

    ``reason`` is the error's text: a refused password or TLS handshake has another fix, as has
    a ``rediss://`` port that does not speak TLS (asked of it: see :func:`refusal`).

    ``Redis at redis://127.0.0.1:6379/0, PIPELINE_REDIS__URL: start it (`make services`) or
    point PIPELINE_REDIS__URL at a running one``.
    """
    address, variable = where(settings, service)
    kind = _refusal_kind(service, address, reason)
    fix = how_to_fix(variable, instead=instead) if kind is None else _refusal_fix(kind, variable)
    if service == "kafka":
        fix += _kafka_client_hint(settings)
    return f"{_NAMES[service]} at {address}, {variable}: {fix}"


def unreachable_at(name: str, address: str, variable: str, reason: str, start: str = START) -> str:
    """The line for service ``name`` at ``address``, set by ``variable``, that gave ``reason``."""
    fix = how_to_fix(variable, start)
    return f"cannot reach {name} at {address} ({variable}): {reason.rstrip('. ')}; {fix}"


def unreachable(settings: Settings, service: Service, reason: str) -> str:
    """The line that says ``service`` cannot be reached, where, why and what to do.

    A Redis that answered but refused the URL's credentials, or whose TLS handshake failed (or
    timed out at a port that takes plain connections: :func:`refusal`), is no service to start:
    its line says so and what to change in ``PIPELINE_REDIS__URL``. For
    Kafka with connection properties in ``PIPELINE_KAFKA__CLIENT`` (a wrong ``security.protocol``
    only times out) the line names them too, by key: their values may be secrets.
    """
    refused = refusal(settings, service, reason)
    return refused if refused is not None else no_answer(settings, service, reason)


def no_answer(settings: Settings, service: Service, reason: str) -> str:
    """The line for a ``service`` that did not answer (``reason``), one :func:`refusal` cleared.

    ``cannot reach ... ; start it (...) or point VARIABLE at a running one`` (and, for Kafka,
    ``PIPELINE_KAFKA__CLIENT``'s connection properties by key), without asking again whether
    the service refused: a caller that found no refusal says so without a second plain probe.
    """
    address, variable = where(settings, service)
    line = unreachable_at(_NAMES[service], address, variable, reason)
    return line + _kafka_client_hint(settings) if service == "kafka" else line


def refusal(settings: Settings, service: Service, reason: str) -> str | None:
    """The line for a ``service`` that answered but refused the credentials or TLS, else None.

    ``reason`` is the error's text. Only a Redis is recognised here (Kafka's refused SASL login
    is asked of the broker: :func:`pipeline.transport.kafka.errors.login_problem`). A
    ``rediss://`` connection that timed out, or failed without a reason, is followed by one plain
    TCP connection to its port (up to 1 s a step): a port that answers a plain ``PING`` (after a
    timeout), or accepts (after a silent failure), makes it a TLS handshake a plain-text port
    never finished, not a Redis that is down.
    """
    address, variable = where(settings, service)
    return _refused(service, address, variable, reason)


_AUTH_FAILED = (
    "WRONGPASS",
    "NOAUTH",
    "invalid username-password pair",
    "Authentication required",
    # A password left out: redis-py strips the NOAUTH prefix from the answer to its HELLO.
    "HELLO must be called with the client already authenticated",
)
_TLS_FAILED = ("SSL", "TLS", "certificate")
_CONNECT_TIMED_OUT = "Timeout connecting to server"
"""redis-py's error for a connection not made in time: the TCP connect or the TLS handshake."""
_CONNECT_FAILED_SILENTLY = re.compile(r"Error connecting to \S+\.?\s*$")
"""redis-py's error for a connection that failed without a reason (asyncio's TLS EOF)."""
_PLAIN_PROBE_S = 1.0
"""How long the plain TCP connection asked of a ``rediss://`` port that did not do TLS may take."""
_REDIS_PORT = 6379

Refusal = Literal["credentials", "tls", "plain port"]


def _refused(service: Service, address: str, variable: str, reason: str) -> str | None:
    """The line for a Redis that refused the credentials or the TLS handshake, else None."""
    kind = _refusal_kind(service, address, reason)
    if kind is None:
        return None
    fix = _refusal_fix(kind, variable)
    why = reason.rstrip(". ")
    if kind == "credentials":
        return f"Redis at {address} ({variable}) refused the credentials: {why}; {fix}"
    if kind == "plain port":
        how = "timed out" if _CONNECT_TIMED_OUT in reason else "failed"
        return f"TLS handshake with Redis at {address} ({variable}) {how} ({why}): {fix}"
    return f"TLS with Redis at {address} ({variable}) failed: {why}; {fix}"


def _refusal_kind(service: Service, address: str, reason: str) -> Refusal | None:
    """Whether Redis refused the credentials or the TLS handshake, or a plain port got TLS."""
    if service != "redis":
        return None
    if any(sign in reason for sign in _AUTH_FAILED):
        return "credentials"
    if any(sign in reason for sign in _TLS_FAILED):
        return "tls"
    if _plain_port(address, reason):
        return "plain port"
    return None


def _refusal_fix(kind: Refusal, variable: str) -> str:
    """What to change in ``variable`` for a Redis that refused ``kind``."""
    if kind == "credentials":
        return f"set the user and password it expects in {variable} (redis://USER:PASSWORD@host:port/db)"
    if kind == "plain port":
        return (
            "the port accepts connections but does not speak TLS? use redis:// for a plain-text"
            f" port, or the server's TLS port, in {variable}"
        )
    return (
        f"use rediss:// only for a TLS port and give the CA that signed the server's"
        f" certificate in {variable} (?ssl_ca_certs=/path/ca.pem)"
    )


def _plain_port(address: str, reason: str) -> bool:
    """Whether ``address`` is ``rediss://`` and its TLS handshake failed at a plain-text port.

    Only a connection that timed out or failed without a reason is looked at, and only then is
    a plain TCP connection opened to the port (each step within :data:`_PLAIN_PROBE_S`). After
    a timeout the port must also answer a plain-text ``PING`` as Redis does (``+PONG``, or an
    error such as ``-NOAUTH``): a TLS Redis too busy to finish handshakes takes connections too,
    and is no plain-text port. A connection that failed without a reason was closed on its TLS
    greeting: one the port accepts is enough.
    """
    if not address.startswith("rediss://"):
        return False
    timed_out = _CONNECT_TIMED_OUT in reason
    if not timed_out and not _CONNECT_FAILED_SILENTLY.search(reason):
        return False
    host_port = _host_port(address)
    if host_port is None:
        return False
    try:
        with socket.create_connection(host_port, timeout=_PLAIN_PROBE_S) as plain:
            if not timed_out:
                return True
            plain.sendall(b"PING\r\n")
            return plain.recv(1)[:1] in (b"+", b"-")
    except (OSError, UnicodeError):
        return False


def _host_port(address: str) -> tuple[str, int] | None:
    """The host and port of Redis URL ``address``, or None if it names none."""
    try:
        parts: SplitResult = urlsplit(address)
        host, port = parts.hostname, parts.port or _REDIS_PORT
    except ValueError:
        return None
    return (host, port) if host else None


def _kafka_client_hint(settings: Settings) -> str:
    """``PIPELINE_KAFKA__CLIENT``'s connection properties, by key, to check; "" if none."""
    keys = sorted(k for k in settings.kafka.client if k.startswith(("security.", "sasl.", "ssl.")))
    if not keys:
        return ""
    return (
        f"; if it runs, check {ENV_PREFIX}KAFKA__CLIENT ({', '.join(keys)}) against the"
        " broker's listener"
    )


def require_listenable(host: str, port: int, *, variable: str, host_variable: str) -> None:
    """Fail with one line, before anything is opened, when ``host:port`` cannot be listened on.

    ``variable`` and ``host_variable`` name the settings (and options) of the port and of the
    address.

    Raises:
        ConfigError: the host is no address or name of this machine, or the port is taken.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise listen_error(host, port, exc, variable, host_variable) from None
        except (UnicodeError, TypeError):  # a label IDNA cannot encode, bytes not UTF-8
            typed = host.encode(errors="surrogateescape").decode(errors="backslashreplace")
            raise ConfigError(
                f"cannot listen on {typed}:{port}: '{typed}' is no host name (a label is empty,"
                f" longer than 63 characters or not UTF-8); set {host_variable} to an address"
                " or name of this machine (127.0.0.1, or 0.0.0.0 for all)"
            ) from None


def listen_error(
    host: str, port: int, exc: OSError, variable: str, host_variable: str, what: str = ""
) -> ConfigError:
    """The one line saying why ``host:port`` cannot be bound, and which setting to change.

    ``variable`` sets the port, ``host_variable`` the address; ``what`` says what would have
    listened there (`` for /metrics``), after the address.
    """
    where = f"cannot listen on {host}:{port}{what}"
    if isinstance(exc, socket.gaierror):  # the address is neither an IP address nor a known name
        if re.fullmatch(r"[\d.]+", host) or ":" in host:
            return ConfigError(
                f"{where}: {host!r} is not a valid IP address; set {host_variable} to an "
                "address of this machine (127.0.0.1, or 0.0.0.0 for all)"
            )
        return ConfigError(
            f"{where}: cannot resolve the host name {host!r} ({exc.strerror or exc}); set "
            f"{host_variable} to an address or name of this machine"
        )
    if exc.errno == errno.EADDRNOTAVAIL:
        return ConfigError(
            f"{where}: {host} is not an address of this machine; set {host_variable} to one "
            "of its addresses (127.0.0.1, or 0.0.0.0 for all)"
        )
    if exc.errno == errno.EACCES:
        return ConfigError(
            f"{where}: {exc.strerror} (a port below 1024 needs privileges); set {variable} to "
            "a port above 1023"
        )
    if exc.errno == errno.EADDRINUSE:
        return ConfigError(
            f"{where}: {exc.strerror}; another process holds it: stop that process or set "
            f"{variable} to a free port"
        )
    return ConfigError(f"{where}: {exc.strerror or exc}; check {host_variable} and {variable}")
