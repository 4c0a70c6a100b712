"""A small synchronous HTTP client for a Confluent-compatible registry (ours or Confluent's).

Used by :mod:`pipeline.registry.client.serde` and the ``schemas`` commands. Schema texts by id are
cached for the life of the client (an id never changes meaning); everything else is asked for
each time. Registry error bodies come back as the matching
:class:`~pipeline.registry.errors.RegistryError` subclass; connection failures as
:class:`~pipeline.registry.errors.RegistryUnreachable`, a
:class:`~pipeline.registry.errors.SerdeError`, whose message names the URL and its variable.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx

from pipeline.config import RegistrySettings
from pipeline.reachability import REGISTRY_VARIABLE, safe_url, unreachable_at
from pipeline.registry import errors

_CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"
_BY_CODE: dict[int, type[errors.RegistryError]] = {
    cls.error_code: cls
    for cls in vars(errors).values()
    if isinstance(cls, type)
    and issubclass(cls, errors.RegistryError)
    and cls is not errors.SerdeError
}


@dataclass(frozen=True, slots=True)
class Registered:
    """A subject version as the registry reports it."""

    subject: str
    version: int
    schema_id: int
    schema: str


_CLIENT = "PIPELINE_REGISTRY__CLIENT_"
_SET_CREDENTIALS = (
    f"; set {_CLIENT}USERNAME and {_CLIENT}PASSWORD, or {_CLIENT}TOKEN, to a user or token"
    " of the registry's PIPELINE_REGISTRY__AUTH__USERS or __TOKENS"
)
_WRITE_ROLE = "; changing the registry needs a user or token of the write role"


def _presented(username: str | None, password: str | None, token: str | None) -> str:
    """Which credentials the client presents, for a refusal's line (never a secret)."""
    if token:
        return f"it was sent the bearer token of {_CLIENT}TOKEN"
    if username and not password:
        return f"it was sent user {username!r} and {_CLIENT}PASSWORD is not set"
    if username:
        return f"it was sent user {username!r} ({_CLIENT}USERNAME, {_CLIENT}PASSWORD)"
    return f"it was sent no credentials ({_CLIENT}USERNAME, {_CLIENT}TOKEN are not set)"


def _q(subject: str) -> str:
    return quote(subject, safe="")


class RegistryClient:
    """Talks to a registry at ``url``; thread-safe."""

    def __init__(
        self,
        url: str,
        *,
        username: str | None = None,
        password: str | None = None,
        token: str | None = None,
        timeout_s: float = 10.0,
        named_by: str = REGISTRY_VARIABLE,
    ) -> None:
        """Prepare a keep-alive HTTP client; ``username``/``password`` or ``token`` if protected.

        ``named_by`` is where the URL came from, as an unreachable registry's line names it (the
        variable, or a command's ``--url``).
        """
        headers = {"Accept": _CONTENT_TYPE, "Content-Type": _CONTENT_TYPE}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        auth = httpx.BasicAuth(username, password or "") if username else None
        self._http = httpx.Client(
            base_url=url.rstrip("/"), headers=headers, auth=auth, timeout=timeout_s
        )
        self._where = safe_url(url.rstrip("/"))
        self._named_by = named_by
        self._presented = _presented(username, password, token)
        self._schemas: dict[int, str] = {}
        self._lock = threading.Lock()

    @property
    def url(self) -> str:
        """The registry's URL as error messages name it (credentials left out)."""
        return self._where

    @classmethod
    def from_settings(
        cls, settings: RegistrySettings, named_by: str = REGISTRY_VARIABLE
    ) -> RegistryClient:
        """A client for ``settings.url`` with the configured client credentials."""
        return cls(
            settings.url,
            username=settings.client_username,
            password=settings.client_password.get_secret_value()
            if settings.client_password
            else None,
            token=settings.client_token.get_secret_value() if settings.client_token else None,
            timeout_s=settings.timeout_s,
            named_by=named_by,
        )

    def _call(self, method: str, path: str, body: Any = None, **params: str) -> Any:
        try:
            response = self._http.request(method, path, json=body, params=params or None)
        except httpx.HTTPError as exc:
            reason = str(exc) or type(exc).__name__
            line = unreachable_at(
                "the schema registry",
                self._where,
                self._named_by,
                reason,
                start="`pipeline registry serve`",
            )
            raise errors.RegistryUnreachable(line) from exc
        if response.is_success:
            return response.json() if response.content else None
        try:
            payload = response.json()
            code, message = int(payload["error_code"]), str(payload["message"])
        except (ValueError, KeyError, TypeError):
            code, message = 50001, response.text[:200]
        cls = _BY_CODE.get(code, errors.RegistryError)
        said = f"{message} (HTTP {response.status_code}, code {code})"
        if issubclass(cls, errors.Unauthorized | errors.Forbidden):
            said += f" from the schema registry at {self._where}: {self._presented}"
            said += _WRITE_ROLE if issubclass(cls, errors.Forbidden) else _SET_CREDENTIALS
        raise cls(said)

    def register(self, subject: str, schema: str) -> int:
        """Register ``schema`` under ``subject`` (idempotent); its global id."""
        result = self._call("POST", f"/subjects/{_q(subject)}/versions", {"schema": schema})
        return int(result["id"])

    def lookup(self, subject: str, schema: str) -> Registered:
        """The version of ``subject`` holding ``schema``.

        Raises:
            SubjectNotFound, SchemaNotFound: it is not registered there.
        """
        got = self._call("POST", f"/subjects/{_q(subject)}", {"schema": schema})
        return Registered(got["subject"], got["version"], got["id"], got["schema"])

    def latest(self, subject: str) -> Registered:
        """The subject's latest live version."""
        got = self._call("GET", f"/subjects/{_q(subject)}/versions/latest")
        return Registered(got["subject"], got["version"], got["id"], got["schema"])

    def schema(self, schema_id: int) -> str:
        """The schema text of ``schema_id`` (cached)."""
        hit = self._schemas.get(schema_id)
        if hit is None:
            hit = str(self._call("GET", f"/schemas/ids/{schema_id}")["schema"])
            with self._lock:
                self._schemas[schema_id] = hit
        return hit

    def subject_versions(self, schema_id: int) -> list[tuple[str, int]]:
        """Every live subject version holding ``schema_id``, as ``(subject, version)``.

        Raises:
            SchemaNotFound: no schema has this id.
        """
        got = self._call("GET", f"/schemas/ids/{schema_id}/versions")
        return [(str(v["subject"]), int(v["version"])) for v in got]

    def subjects(self) -> list[str]:
        """Every live subject."""
        return list(self._call("GET", "/subjects"))

    def versions(self, subject: str) -> list[int]:
        """The subject's live version numbers."""
        return list(self._call("GET", f"/subjects/{_q(subject)}/versions"))

    def compatibility_problems(self, subject: str, schema: str) -> list[str]:
        """Why ``schema`` would be refused under ``subject``; empty if it would be accepted."""
        result = self._call(
            "POST",
            f"/compatibility/subjects/{_q(subject)}/versions",
            {"schema": schema},
            verbose="true",
        )
        return [] if result["is_compatible"] else list(result.get("messages") or ["incompatible"])

    def close(self) -> None:
        """Close the HTTP connections."""
        self._http.close()
