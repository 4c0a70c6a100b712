"""Ingress settings (environment, ``PIPELINE_INGRESS__*``) and the sources file (YAML).

:class:`~pipeline.config.IngressSettings` is the ingress's section of the root settings
(``PIPELINE_INGRESS__PORT=8080``, ``PIPELINE_INGRESS__SOURCES_FILE=sources.yaml``,
``PIPELINE_INGRESS__SWEEPER__PATIENCE_S=300``).
The sources file declares one entry per ``/hooks/{source}``; ``deploy/local/sources.example.yaml``
documents every field. :func:`load_sources` turns every problem in it into one
:class:`~pipeline.errors.ConfigError` whose lines read ``<file>: <field path>: <problem>``;
:func:`load_source` does the same for one source only (``pipeline send``).

Secrets are never written in the file: ``env:NAME`` reads the environment variable ``NAME`` at
start, and a missing or empty one is an error (a misconfigured verifier fails closed), as is one
that is only whitespace or begins or ends with whitespace (a trailing newline from ``echo``).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictStr,
    ValidationError,
    model_validator,
)

from pipeline.config import IngressSlotSettings
from pipeline.errors import ConfigError
from pipeline.ingress.extract import parse_pointer
from pipeline.topics.spec import read_yaml
from pipeline.validation import field_path

_SOURCE_NAME = re.compile(r"[A-Za-z0-9_.-]+")
_DOT_SEGMENTS = (".", "..")
"""Names the pattern allows that no client can reach: it removes them from the path (RFC 3986)."""
_MIB = 1_048_576


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _UnsetVariable(ValueError):
    """An ``env:NAME`` secret whose variable is not set (or empty): the file itself is fine."""

    def __init__(self, name: str) -> None:
        super().__init__(f"environment variable {name} is not set or empty (or only whitespace)")
        self.name = name


def _secret(value: str) -> str:
    if value.startswith("env:"):
        name = value.removeprefix("env:")
        resolved = os.environ.get(name, "")
        if not resolved.strip():
            raise _UnsetVariable(name)
        if problem := _spaced(resolved):
            raise ValueError(f"environment variable {name} {problem}")
        return resolved
    if not value.strip():
        raise ValueError("a secret must not be empty")
    if problem := _spaced(value):
        raise ValueError(f"a secret {problem}")
    return value


def _spaced(secret: str) -> str | None:
    """Why ``secret`` cannot be meant as it is (whitespace around it), or None.

    No provider's secret begins or ends with whitespace; one that does was written by ``echo``
    or copied with a space, and would make every signature fail (401) with nothing saying why.
    """
    if secret.endswith("\n"):
        return (
            "ends with a newline (as `echo` writes it): remove it "
            "(`printf %s`, `kubectl create secret --from-literal`)"
        )
    if secret != secret.strip():
        return "begins or ends with whitespace: remove it"
    return None


def _pointer(value: str) -> str:
    parse_pointer(value)
    return value


Secret = Annotated[StrictStr, AfterValidator(_secret)]
"""A secret written as ``env:NAME`` (read from the environment at start) or literally."""
Pointer = Annotated[StrictStr, AfterValidator(_pointer)]
Scalar = StrictStr | int | float | StrictBool | None


class ValueFrom(_Model):
    """Where a value comes from: exactly one of a JSON pointer, a header, or a constant."""

    pointer: Pointer | None = None
    header: StrictStr | None = None
    value: StrictStr | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> ValueFrom:
        if sum(x is not None for x in (self.pointer, self.header, self.value)) != 1:
            raise ValueError("set exactly one of pointer, header, value")
        return self


class Condition(_Model):
    """A routing test on the values found at ``pointer``: ``equals``, ``in`` or ``exists``."""

    pointer: Pointer
    equals: Scalar = None
    in_: list[Scalar] | None = Field(default=None, alias="in")
    exists: StrictBool | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> Condition:
        tests = [self.in_ is not None, self.exists is not None, "equals" in self.model_fields_set]
        if sum(tests) != 1:
            raise ValueError("set exactly one of equals, in, exists")
        return self


class RouteRule(_Model):
    """Send the event to ``topic`` when ``when`` matches; the first matching rule wins."""

    when: Condition
    topic: StrictStr


class HmacOptions(_Model):
    """The form of a generic HMAC header (scheme ``hmac``)."""

    header: StrictStr
    algorithm: Literal["sha1", "sha256", "sha512"] = "sha256"
    encoding: Literal["hex", "base64"] = "hex"
    prefix: StrictStr = ""


Scheme = Literal["meta", "github", "stripe", "standard_webhooks", "hmac", "none"]


class SourceConfig(_Model):
    """One webhook source, served at ``/hooks/{name}``."""

    scheme: Scheme
    secrets: list[Secret] = Field(default_factory=list)
    verify_token: Secret | None = None
    tolerance_s: int = Field(default=300, ge=1)
    max_body_bytes: int = Field(default=_MIB, ge=1, le=64 * _MIB)
    tenant: ValueFrom | None = None
    key: ValueFrom | None = None
    event_id: ValueFrom | None = None
    keep_headers: list[StrictStr] = Field(default_factory=list)
    topic: StrictStr
    routes: list[RouteRule] = Field(default_factory=list)
    hmac: HmacOptions | None = None
    admission: IngressSlotSettings | None = None

    @model_validator(mode="after")
    def _scheme_needs(self) -> SourceConfig:
        if self.scheme != "none" and not self.secrets:
            raise ValueError(f"scheme {self.scheme!r} needs at least one secret in 'secrets'")
        if self.scheme == "none" and self.secrets:
            raise ValueError("scheme 'none' verifies nothing; remove 'secrets' or pick a scheme")
        if (self.scheme == "hmac") != (self.hmac is not None):
            raise ValueError("'hmac' options are required by, and only allowed with, scheme hmac")
        return self


class SourcesFile(_Model):
    """The whole sources file."""

    sources: dict[StrictStr, SourceConfig]


def load_sources(path: Path, topics: set[str]) -> dict[str, SourceConfig]:
    """Read and validate the sources file against the declared topics.

    Args:
        path: the YAML file.
        topics: the names of the topics declared in ``topics/*.yaml``.

    Raises:
        ConfigError: the file is missing (the line says what to copy or set) or invalid, a
            secret is missing, or a source routes to a topic that is not declared; every line
            names the file and the field.
    """
    parsed = _validated(path, _document(path))
    _check_names_and_topics(path, parsed.sources, topics)
    return dict(parsed.sources)


def load_source(path: Path, topics: set[str], name: str) -> SourceConfig:
    """Read, validate and resolve only source ``name`` of the sources file, to sign for it.

    ``pipeline send`` signs with one source's secrets: the other sources' secrets, and this
    one's ``verify_token`` (Meta's subscription handshake, which nothing sends), need not be
    exported where it runs. The errors of this source's own fields read as
    :func:`load_sources` says them (``<file>: sources.<name>.secrets[0]: ...``); the ingress
    still validates every source at start.

    Raises:
        ConfigError: the file is missing or is no mapping of sources, ``name`` is not declared
            in it (the line names the declared ones), or the source is invalid.
    """
    document = _document(path)
    sources = document.get("sources")
    if isinstance(sources, dict) and name not in sources:
        known = ", ".join(sorted(str(key) for key in sources)) or "none"
        raise ConfigError(f"{path}: no source {name!r} (declared: {known})")
    if isinstance(sources, dict):
        entry = sources[name]
        if isinstance(entry, dict):
            entry = {key: value for key, value in entry.items() if key != "verify_token"}
        document = {**document, "sources": {name: entry}}
    parsed = _validated(path, document)
    _check_names_and_topics(path, parsed.sources, topics)
    return parsed.sources[name]


def _document(path: Path) -> dict[Any, Any]:
    """The sources file's YAML mapping, or ConfigError (a missing file: what to copy or set)."""
    if not path.exists():  # the first run's usual miss: say what to copy or set
        raise ConfigError(
            f"no sources file at {path}: copy deploy/local/sources.example.yaml there, or set"
            " PIPELINE_INGRESS__SOURCES_FILE (pipeline ingress serve: --sources) to yours"
        )
    document = read_yaml(path, ConfigError, "(the sources file)")
    if not isinstance(document, dict):
        raise ConfigError(f"{path}: expected a mapping with a 'sources' key")
    return document


def _validated(path: Path, document: dict[Any, Any]) -> SourcesFile:
    """``document`` as a :class:`SourcesFile` (secrets read), or one line per problem."""
    try:
        return SourcesFile.model_validate(document)
    except ValidationError as exc:
        lines = [f"{path}: {field_path(e['loc'])}: {_message(e)}" for e in exc.errors()]
        unset = [_unset_variable(e) for e in exc.errors()]
        if all(unset):  # the file is fine: what is missing is where the command runs
            names = ", ".join(dict.fromkeys(name for name in unset if name))
            raise ConfigError(
                "; ".join(lines) + f": export {names} where this command runs"
            ) from None
        raise ConfigError("invalid sources file:\n  " + "\n  ".join(lines)) from None


def _unset_variable(error: Any) -> str | None:
    """The variable of an ``env:NAME`` secret that is not set, if that is ``error``."""
    cause = error.get("ctx", {}).get("error") if error["type"] == "value_error" else None
    return cause.name if isinstance(cause, _UnsetVariable) else None


def _check_names_and_topics(path: Path, sources: dict[str, SourceConfig], topics: set[str]) -> None:
    """ConfigError, one line per problem, for a bad source name or an undeclared topic."""
    problems = []
    for name, source in sources.items():
        if not _SOURCE_NAME.fullmatch(name):
            problems.append(f"{path}: sources.{name}: expected letters, digits, '.', '_', '-'")
        elif name in _DOT_SEGMENTS:
            problems.append(
                f"{path}: sources.{name}: '.' and '..' are path steps HTTP clients remove"
                f" from /hooks/{name}; choose another name"
            )
        targets = [("topic", source.topic)]
        targets += [(f"routes[{i}].topic", rule.topic) for i, rule in enumerate(source.routes)]
        problems.extend(
            f"{path}: sources.{name}.{field}: topic {topic!r} is not declared in the topics "
            f"directory (declared: {', '.join(sorted(topics)) or 'none'})"
            for field, topic in targets
            if topic not in topics
        )
    if problems:
        raise ConfigError("invalid sources file:\n  " + "\n  ".join(problems))


def _message(error: Any) -> str:
    if error["type"] == "value_error":
        return str(error.get("ctx", {}).get("error", error["msg"]))
    if error["type"] == "missing":
        return "required field is missing"
    if error["type"] == "extra_forbidden":
        return "unknown field (see deploy/local/sources.example.yaml)"
    value = error.get("input")
    secret = any(part in {"secrets", "verify_token"} for part in error["loc"])
    if secret or not isinstance(value, str | int | float | bool | None):
        return str(error["msg"])  # never echo a secret or a whole mapping
    return f"{error['msg']} (got {value!r})"
