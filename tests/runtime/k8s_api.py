"""A recording stand-in for the Kubernetes API server's Pod PATCH, for scale-in protection tests.

It speaks the part of the API a member uses: ``PATCH /api/v1/namespaces/NS/pods/NAME`` with a
bearer token and ``Content-Type: application/merge-patch+json``, applied as a JSON merge patch
(RFC 7386) to the Pods it holds, answering the patched Pod (200), or the API's Status objects:
401 without a token, 404 for an unknown Pod, 415 for another patch type, 422 for an annotation
value that is not a string. Every request is recorded.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route


def _status(code: int, reason: str, message: str) -> JSONResponse:
    body = {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    return JSONResponse(body, status_code=code)


def _merge(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge key by key, null deletes, anything else replaces."""
    if not isinstance(patch, dict):
        return patch
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = _merge(out.get(key), value)
    return out


@dataclass
class PodApi:
    """The Pods of the stand-in and every PATCH it received (path, content type, body)."""

    pods: dict[tuple[str, str], dict[str, Any]]
    calls: list[tuple[str, str, Any]] = field(default_factory=list)

    def annotation_values(self, namespace: str, name: str, annotation: str) -> list[str]:
        """The values ``annotation`` was given on one Pod, in order of the accepted patches."""
        path = f"/api/v1/namespaces/{namespace}/pods/{name}"
        return [
            body["metadata"]["annotations"][annotation]
            for p, _, body in self.calls
            if p == path and annotation in body.get("metadata", {}).get("annotations", {})
        ]

    async def patch(self, request: Request) -> JSONResponse:
        """Apply one merge patch, as the API server would."""
        namespace, name = request.path_params["namespace"], request.path_params["name"]
        content_type = request.headers.get("content-type", "")
        body = await request.json()
        self.calls.append((request.url.path, content_type, body))
        if not request.headers.get("authorization", "").startswith("Bearer "):
            return _status(401, "Unauthorized", "Unauthorized")
        if content_type.split(";")[0].strip() != "application/merge-patch+json":
            return _status(415, "UnsupportedMediaType", f"the media type {content_type!r} ...")
        pod = self.pods.get((namespace, name))
        if pod is None:
            return _status(404, "NotFound", f'pods "{name}" not found')
        annotations = body.get("metadata", {}).get("annotations", {}) or {}
        if not all(isinstance(v, str) or v is None for v in annotations.values()):
            return _status(422, "Invalid", "metadata.annotations: values must be strings")
        patched = _merge(copy.deepcopy(pod), body)
        version = int(pod["metadata"].get("resourceVersion", "1")) + 1
        patched["metadata"]["resourceVersion"] = str(version)
        self.pods[namespace, name] = patched
        return JSONResponse(patched)


@contextlib.asynccontextmanager
async def serving(api: PodApi) -> AsyncIterator[str]:
    """Serve ``api`` on a free loopback port; yields its base URL."""
    app = Starlette(
        routes=[Route("/api/v1/namespaces/{namespace}/pods/{name}", api.patch, methods=["PATCH"])]
    )
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)  # connections wait in the backlog until the server accepts them
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task
        sock.close()


def pod(namespace: str, name: str) -> dict[str, Any]:
    """A minimal Pod object as the API server holds it."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "resourceVersion": "1",
            "annotations": {"kept": "yes"},
        },
    }
