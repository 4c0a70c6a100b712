"""The Confluent-compatible REST API (Starlette), as ``confluent_kafka.schema_registry`` calls it.

Routing is done on the raw request path, one percent-decoded segment at a time, because the
client URL-encodes subjects (``a%2Fb`` must stay one segment) and servers decode ``%2F`` in
``scope["path"]``. Every answer has the content type ``application/vnd.schemaregistry.v1+json``;
every error the body ``{"error_code": ..., "message": ...}`` (see
:mod:`pipeline.registry.errors`). Boolean query flags are case-insensitive (the client sends both
``normalize=False`` and ``deleted=true``). Store calls run in the thread pool, never on the event
loop. The endpoint list is in ``docs/registry.md``.
"""

from __future__ import annotations

import copy
import logging
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from pipeline.config import AuthSettings
from pipeline.registry.canonical import ParsedSchema, read_json
from pipeline.registry.errors import (
    IncompatibleSchema,
    InvalidSchema,
    InvalidSubject,
    InvalidVersion,
    RegistryError,
    SchemaNotFound,
    StoreError,
    SubjectNotFound,
    Unauthorized,
    cut_middle,
)
from pipeline.registry.server.auth import CHALLENGE, Authenticator
from pipeline.registry.server.service import Registry, require_text
from pipeline.registry.stores.protocol import (
    MAX_ID,
    Check,
    RegistryStore,
    SettingKind,
    StoredSchema,
    SubjectVersion,
)

log = logging.getLogger(__name__)
MEDIA_TYPE = "application/vnd.schemaregistry.v1+json"
Params = dict[str, str]


@dataclass(frozen=True, slots=True)
class _Ctx:
    """What a handler gets: the registry, the request and the path parameters."""

    reg: Registry
    req: Request
    p: Params


Handler = Callable[[_Ctx], Awaitable[Any]]


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
"""Java's ISO control characters, which Confluent refuses in a subject it is to create."""
MAX_SUBJECT_BYTES = 2048
"""Longest subject created, in UTF-8 bytes: a PostgreSQL btree entry holds at most 2704 bytes,
so a longer key made registering (or setting a level or mode) fail there with a 500."""
_SHOWN = 80  # characters of a refused subject echoed in the message


def _creatable(subject: str) -> str:
    """``subject`` if a subject of that name may be created; else InvalidSubject (42208)."""
    shown = repr(subject[:_SHOWN]) + ("..." if len(subject) > _SHOWN else "")
    if _CONTROL.search(subject):
        raise InvalidSubject(
            f"The specified subject {shown} is not valid: it holds a control character"
        )
    if len(subject.encode()) > MAX_SUBJECT_BYTES:
        raise InvalidSubject(
            f"The specified subject {shown} is not valid: longer than {MAX_SUBJECT_BYTES} bytes"
        )
    return subject


class _WithoutNulSubjects:
    """A store through which a subject holding NUL has no versions and no settings.

    PostgreSQL text cannot hold NUL (psycopg refuses to send it) and no subject with a control
    character is ever created, so such a subject cannot exist: a request naming it gets the
    answers of an unknown subject without asking the database.
    """

    def __init__(self, store: RegistryStore) -> None:
        self._store = store

    def register(
        self,
        subject: str,
        schema: ParsedSchema,
        check: Check,
        *,
        schema_id: int | None = None,
        version: int | None = None,
    ) -> SubjectVersion:
        subject = _creatable(subject)
        return self._store.register(subject, schema, check, schema_id=schema_id, version=version)

    def schema(self, schema_id: int) -> StoredSchema | None:
        return self._store.schema(schema_id)

    def versions(self, subject: str) -> list[SubjectVersion]:
        return [] if "\x00" in subject else self._store.versions(subject)

    def subjects(self) -> dict[str, bool]:
        return self._store.subjects()

    def usages(self, schema_id: int) -> list[SubjectVersion]:
        return self._store.usages(schema_id)

    def mark_deleted(self, subject: str, versions: Sequence[int]) -> None:
        self._store.mark_deleted(subject, versions)

    def purge(self, subject: str, versions: Sequence[int]) -> None:
        self._store.purge(subject, versions)

    def purge_subject(self, subject: str, check: Check) -> list[int]:
        if "\x00" in subject:
            check([])  # no versions: refused as an unknown subject
            return []
        return self._store.purge_subject(subject, check)

    def get_setting(self, kind: SettingKind, subject: str) -> str | None:
        return None if "\x00" in subject else self._store.get_setting(kind, subject)

    def set_setting(self, kind: SettingKind, subject: str, value: str) -> None:
        self._store.set_setting(kind, _creatable(subject), value)

    def delete_setting(self, kind: SettingKind, subject: str) -> str | None:
        return None if "\x00" in subject else self._store.delete_setting(kind, subject)

    def close(self) -> None:
        self._store.close()


def _for_subject(registry: Registry, subject: str | None) -> Registry:
    """``registry``, or for a subject holding NUL a copy reading through the guard above."""
    if subject is None or "\x00" not in subject:
        return registry
    guarded = copy.copy(registry)
    guarded.store = _WithoutNulSubjects(registry.store)
    return guarded


class RegistryResponse(JSONResponse):
    """JSON with the schema registry's content type."""

    media_type = MEDIA_TYPE


def _error(exc: RegistryError) -> Response:
    headers = {"WWW-Authenticate": CHALLENGE} if isinstance(exc, Unauthorized) else None
    # A 409 lists every broken rule, each cut where it was made (service.py); others are cut here
    message = str(exc) if isinstance(exc, IncompatibleSchema) else cut_middle(str(exc))
    body = {"error_code": exc.error_code, "message": message}
    return RegistryResponse(body, status_code=exc.http_status, headers=headers)


def _flag(request: Request, *names: str) -> bool:
    return any(request.query_params.get(n, "").lower() == "true" for n in names)


def _page(request: Request, items: list[Any]) -> list[Any]:
    try:
        offset = max(0, int(request.query_params.get("offset", "0")))
        limit = int(request.query_params.get("limit", "-1"))
    except ValueError:
        return items
    return items[offset : offset + limit if limit > 0 else None]


async def _read_capped(request: Request, max_bytes: int) -> bytes:
    """The body, refused (42201) as soon as it passes ``max_bytes``: never buffered whole."""
    too_large = InvalidSchema(f"Invalid schema: request body over {max_bytes} bytes")
    declared = request.headers.get("content-length", "")
    digits = declared.isascii() and declared.isdigit()
    if digits and (len(declared) > len(str(max_bytes)) or int(declared) > max_bytes):
        raise too_large
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:
            raise too_large
        chunks.append(chunk)
    return b"".join(chunks)


async def _body(request: Request, max_bytes: int) -> dict[str, Any]:
    body = read_json(await _read_capped(request, max_bytes), "Invalid request body")
    if not isinstance(body, dict):
        raise InvalidSchema("Invalid request body: expected a JSON object")
    return body


def _schema_text(body: dict[str, Any]) -> str:
    kind = body.get("schemaType") or "AVRO"
    if kind != "AVRO":
        raise InvalidSchema(f"Invalid schema: schema type {kind!r} is not supported (only AVRO)")
    if body.get("references"):
        raise InvalidSchema("Invalid schema: schema references are not supported")
    if body.get("metadata") or body.get("ruleSet"):
        raise InvalidSchema("Invalid schema: metadata and rule sets are not supported")
    return require_text(body.get("schema"))


def _in_range(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 < value <= MAX_ID


def _id_field(body: dict[str, Any]) -> int | None:
    """The IMPORT ``id``: 1 to 2^31-1 (Confluent's int; larger ones overflow the stores)."""
    value = body.get("id")
    if value is None or _in_range(value):
        return value
    raise InvalidSchema("Invalid request body: 'id' must be a positive integer up to 2^31-1")


def _version_field(body: dict[str, Any]) -> int | None:
    """The IMPORT ``version``: 1 to 2^31-1, else 42202 as for a version in the path."""
    value = body.get("version")
    if value is None or _in_range(value):
        return value
    raise InvalidVersion(
        f"The specified version '{str(value)[:40]}' is not a valid version id. Allowed values "
        'are between [1, 2^31-1] and the string "latest"'
    )


def _version_body(v: SubjectVersion) -> dict[str, Any]:
    return {"subject": v.subject, "version": v.version, "id": v.schema_id, "schema": v.schema}


def _schema_id(raw: str) -> int:
    """A schema id path segment as a number; anything but 1 to 2^31-1 in ASCII digits names none.

    ``str.isdigit`` alone accepts ``²`` and other digits ``int`` refuses or reads differently, and
    a number past the stores' integer columns would reach the database (SQLite overflows).
    """
    digits = raw.lstrip("0")
    ascii_digits = raw.isascii() and raw.isdigit()
    if not ascii_digits or len(digits) > len(str(MAX_ID)) or int(digits or "0") > MAX_ID:
        raise SchemaNotFound(f"Schema {raw[:40]} not found")
    return int(digits or "0")


@dataclass(frozen=True, slots=True)
class _Route:
    method: str
    pattern: tuple[str, ...]
    handler: Handler
    write: bool = False

    def match(self, method: str, segments: list[str]) -> Params | None:
        if method != self.method or len(segments) != len(self.pattern):
            return None
        params: Params = {}
        for want, got in zip(self.pattern, segments, strict=True):
            if want.startswith("{"):
                if not got:
                    return None
                params[want[1:-1]] = got
            elif want != got:
                return None
        return params


def _call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Awaitable[Any]:
    return run_in_threadpool(fn, *args, **kwargs)


# -- handlers ---------------------------------------------------------------------------------


async def _root(_c: _Ctx) -> Any:
    return {}


async def _types(_c: _Ctx) -> Any:
    return ["AVRO"]


async def _contexts(_c: _Ctx) -> Any:
    return ["."]


async def _schema_by_id(c: _Ctx) -> Any:
    stored = await _call(c.reg.schema, _schema_id(c.p["id"]))
    return {"schema": stored.schema}


async def _raw_schema_by_id(c: _Ctx) -> Any:
    stored = await _call(c.reg.schema, _schema_id(c.p["id"]))
    return PlainTextResponse(stored.schema, media_type=MEDIA_TYPE)


async def _usages(c: _Ctx) -> list[SubjectVersion]:
    schema_id = _schema_id(c.p["id"])
    await _call(c.reg.schema, schema_id)
    rows: list[SubjectVersion] = await _call(c.reg.store.usages, schema_id)
    subject = c.req.query_params.get("subject")
    deleted = _flag(c.req, "deleted")
    return [r for r in rows if (deleted or not r.deleted) and subject in {None, r.subject}]


async def _id_subjects(c: _Ctx) -> Any:
    return _page(c.req, sorted({r.subject for r in await _usages(c)}))


async def _id_versions(c: _Ctx) -> Any:
    rows = await _usages(c)
    return _page(c.req, [{"subject": r.subject, "version": r.version} for r in rows])


async def _subjects(c: _Ctx) -> Any:
    names = await _call(
        c.reg.subjects,
        deleted=_flag(c.req, "deleted"),
        deleted_only=_flag(c.req, "deleted_only", "deletedOnly"),
    )
    prefix = c.req.query_params.get("subjectPrefix", "")
    return _page(c.req, [n for n in names if n.startswith(prefix)])


async def _versions(c: _Ctx) -> Any:
    rows = await _call(
        c.reg.versions,
        c.p["subject"],
        deleted=_flag(c.req, "deleted"),
        deleted_only=_flag(c.req, "deleted_only", "deletedOnly"),
    )
    return _page(c.req, [v.version for v in rows])


async def _register(c: _Ctx) -> Any:
    body = await _body(c.req, c.req.app.state.max_body_bytes)
    _creatable(c.p["subject"])
    text = _schema_text(body)
    registered = await _call(
        c.reg.register,
        c.p["subject"],
        text,
        schema_id=_id_field(body),
        version=_version_field(body),
    )
    return {"id": registered.schema_id}


async def _lookup(c: _Ctx) -> Any:
    text = _schema_text(await _body(c.req, c.req.app.state.max_body_bytes))
    found = await _call(c.reg.lookup, c.p["subject"], text, deleted=_flag(c.req, "deleted"))
    return _version_body(found)


async def _delete_subject(c: _Ctx) -> Any:
    return await _call(c.reg.delete_subject, c.p["subject"], permanent=_flag(c.req, "permanent"))


async def _get_version(c: _Ctx) -> Any:
    found = await _call(
        c.reg.version, c.p["subject"], c.p["version"], deleted=_flag(c.req, "deleted")
    )
    return _version_body(found)


async def _get_version_schema(c: _Ctx) -> Any:
    found = await _call(
        c.reg.version, c.p["subject"], c.p["version"], deleted=_flag(c.req, "deleted")
    )
    return PlainTextResponse(found.schema, media_type=MEDIA_TYPE)


async def _referenced_by(c: _Ctx) -> Any:
    await _call(c.reg.version, c.p["subject"], c.p["version"], deleted=True)
    return []  # schema references are not supported, so nothing can reference a version


async def _delete_version(c: _Ctx) -> Any:
    return await _call(
        c.reg.delete_version, c.p["subject"], c.p["version"], permanent=_flag(c.req, "permanent")
    )


async def _test(c: _Ctx) -> Any:
    text = _schema_text(await _body(c.req, c.req.app.state.max_body_bytes))
    problems = await _call(c.reg.test, c.p["subject"], text, c.p.get("version"))
    result: dict[str, Any] = {"is_compatible": not problems}
    if _flag(c.req, "verbose"):
        result["messages"] = problems
    return result


async def _get_config(c: _Ctx) -> Any:
    if "subject" in c.p:
        level = await _call(
            c.reg.subject_compatibility,
            c.p["subject"],
            default_to_global=_flag(c.req, "defaultToGlobal"),
        )
    else:
        level = await _call(c.reg.compatibility)
    return {"compatibilityLevel": level.value}


async def _put_config(c: _Ctx) -> Any:
    body = await _body(c.req, c.req.app.state.max_body_bytes)
    if "subject" in c.p:
        _creatable(c.p["subject"])
    raw = body.get("compatibility", body.get("compatibilityLevel"))
    level = await _call(c.reg.set_compatibility, c.p.get("subject"), raw)
    return {"compatibility": level.value}


async def _delete_config(c: _Ctx) -> Any:
    level = await _call(c.reg.delete_compatibility, c.p.get("subject"))
    return {"compatibilityLevel": level.value}


async def _get_mode(c: _Ctx) -> Any:
    if "subject" in c.p:
        mode = await _call(
            c.reg.subject_mode, c.p["subject"], default_to_global=_flag(c.req, "defaultToGlobal")
        )
    else:
        mode = await _call(c.reg.mode)
    return {"mode": mode.value}


async def _put_mode(c: _Ctx) -> Any:
    body = await _body(c.req, c.req.app.state.max_body_bytes)
    if "subject" in c.p:
        _creatable(c.p["subject"])
    mode = await _call(
        c.reg.set_mode, c.p.get("subject"), body.get("mode"), force=_flag(c.req, "force")
    )
    return {"mode": mode.value}


async def _delete_mode(c: _Ctx) -> Any:
    return {"mode": (await _call(c.reg.delete_mode, c.p["subject"])).value}


async def _no_associations(_c: _Ctx) -> Any:
    # Answered 404 so the client's AssociatedNameStrategy falls back to "{topic}-value".
    raise SubjectNotFound("Association not found: associations are not supported")


_S = "{subject}"
_V = "{version}"
ROUTES: tuple[_Route, ...] = (
    _Route("GET", (), _root),
    _Route("GET", ("schemas", "types"), _types),
    _Route("GET", ("contexts",), _contexts),
    _Route("GET", ("schemas", "ids", "{id}"), _schema_by_id),
    _Route("GET", ("schemas", "ids", "{id}", "schema"), _raw_schema_by_id),
    _Route("GET", ("schemas", "ids", "{id}", "subjects"), _id_subjects),
    _Route("GET", ("schemas", "ids", "{id}", "versions"), _id_versions),
    _Route("GET", ("subjects",), _subjects),
    _Route("POST", ("subjects", _S), _lookup),
    _Route("DELETE", ("subjects", _S), _delete_subject, write=True),
    _Route("GET", ("subjects", _S, "versions"), _versions),
    _Route("POST", ("subjects", _S, "versions"), _register, write=True),
    _Route("GET", ("subjects", _S, "versions", _V), _get_version),
    _Route("GET", ("subjects", _S, "versions", _V, "schema"), _get_version_schema),
    _Route("GET", ("subjects", _S, "versions", _V, "referencedby"), _referenced_by),
    _Route("DELETE", ("subjects", _S, "versions", _V), _delete_version, write=True),
    _Route("POST", ("compatibility", "subjects", _S, "versions", _V), _test),
    _Route("POST", ("compatibility", "subjects", _S, "versions"), _test),
    _Route("GET", ("config",), _get_config),
    _Route("PUT", ("config",), _put_config, write=True),
    _Route("DELETE", ("config",), _delete_config, write=True),
    _Route("GET", ("config", _S), _get_config),
    _Route("PUT", ("config", _S), _put_config, write=True),
    _Route("DELETE", ("config", _S), _delete_config, write=True),
    _Route("GET", ("mode",), _get_mode),
    _Route("PUT", ("mode",), _put_mode, write=True),
    _Route("GET", ("mode", _S), _get_mode),
    _Route("PUT", ("mode", _S), _put_mode, write=True),
    _Route("DELETE", ("mode", _S), _delete_mode, write=True),
    _Route("GET", ("associations", "resources", "{ns}", "{name}"), _no_associations),
)


def _segments(request: Request) -> list[str]:
    raw: bytes = request.scope.get("raw_path") or request.scope["path"].encode()
    path = raw.decode("latin-1").partition("?")[0].strip("/")
    return [unquote(s) for s in path.split("/")] if path else []


async def _dispatch(request: Request) -> Response:
    registry: Registry = request.app.state.registry
    segments = _segments(request)
    try:
        for route in ROUTES:
            params = route.match(request.method, segments)
            if params is None:
                continue
            request.app.state.auth.authorize(
                request.headers.get("authorization"), write=route.write
            )
            scoped = _for_subject(registry, params.get("subject"))
            result = await route.handler(_Ctx(scoped, request, params))
            return result if isinstance(result, Response) else RegistryResponse(result)
        known = any(r.match(r.method, segments) is not None for r in ROUTES)
        status = 405 if known else 404
        message = "HTTP 405 Method Not Allowed" if known else "HTTP 404 Not Found"
        return RegistryResponse({"error_code": status, "message": message}, status_code=status)
    except StoreError as exc:
        # The database's own message may name tables, hosts or values: it stays in the log.
        log.error("registry store failed: %s %s: %s", request.method, request.url.path, exc)  # noqa: TRY400 - the error is the store's, a traceback adds nothing
        return _error(StoreError("Error in the backend data store"))
    except RegistryError as exc:
        return _error(exc)
    except Exception:
        log.exception("registry request failed: %s %s", request.method, request.url.path)
        body = {"error_code": 50001, "message": "Error in the backend data store"}
        return RegistryResponse(body, status_code=500)


async def _unrouted(request: Request, _exc: Exception) -> Response:
    """Dispatch a path Starlette's router cannot match, like any other.

    Its pattern's ``.`` stops at a newline, so ``/subjects/a%0Ab/versions`` matched no route
    and got Starlette's plain-text 404 instead of the registry's own answer.
    """
    return await _dispatch(request)


def create_app(
    store: RegistryStore,
    *,
    registry: Registry | None = None,
    auth: AuthSettings | None = None,
    max_body_bytes: int = 1_048_576,
) -> Starlette:
    """The registry's ASGI application over ``store``.

    Args:
        store: where schemas live; the caller opens and closes it.
        registry: the rules to serve (default: ``Registry(store)`` with BACKWARD, READWRITE).
        auth: who may read and write (default: no authentication).
        max_body_bytes: larger request bodies are refused with 42201.
    """
    methods = ["GET", "POST", "PUT", "DELETE"]
    app = Starlette(
        routes=[
            Route("/", _dispatch, methods=methods),
            Route("/{rest:path}", _dispatch, methods=methods),
        ],
        exception_handlers={404: _unrouted},
    )
    app.state.registry = registry or Registry(store)
    app.state.auth = Authenticator(auth or AuthSettings())
    app.state.max_body_bytes = max_body_bytes
    return app
