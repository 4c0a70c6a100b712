"""A key without ``s3:ListBucket`` (a least-privilege policy) writes and reads every payload.

For such a key AWS answers a HEAD or GET of an object that does not exist 403 AccessDenied, not
404: the writer's look before a content-addressed write is refused for every new payload. A
refused look is "unknown": the payload is written (a PUT of the same key is idempotent), and the
PUT tells a key that works from one refused whatever it asks (SignatureDoesNotMatch,
InvalidAccessKeyId), which still fails the write (a 503 at the ingress).

S3Proxy cannot answer per-key 403s: those answers come from a small S3 stand-in behind the real
S3 client (obstore, and httpx for the write), which serves objects as AWS does to such a key.
A wrong secret is S3Proxy's own refusal.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import logging
import os
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from email.utils import formatdate
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
import yaml
from ingress.signing import hub_signature
from offload.helpers import S3PROXY
from support import require_service

from pipeline.config import IngressSlotSettings
from pipeline.ingress.app import IngressApp
from pipeline.ingress.settings import load_sources
from pipeline.ingress.source import build_sources
from pipeline.logstore import Selection
from pipeline.logstore.sqlite import SqliteLogStore
from pipeline.offload import reference as ref
from pipeline.offload.errors import OffloadError
from pipeline.offload.lazy import LazyPayload
from pipeline.offload.policy import OffloadPolicy
from pipeline.offload.rows import offload_row
from pipeline.offload.writer import Offloader
from pipeline.retry.policy import default_retryable
from pipeline.topics.spec import TopicSpec

STORE = "s3://payloads/lp"
SECRET = "meta-app-secret"  # noqa: S105 - a test secret
BODY = b'{"big": "' + b"z" * 4096 + b'"}'
WRONG_SECRET = "wrong-secret-5be1a0"  # noqa: S105 - what S3Proxy must refuse


def _error(code: str) -> bytes:
    return f"<Error><Code>{code}</Code><Message>{code}</Message></Error>".encode()


@dataclass
class LeastPrivilegeS3:
    """An S3 stand-in answering as AWS does to a key without ``s3:ListBucket``.

    HEAD of a stored object: 200; of a missing one: 403, no body. GET: the object, or 403
    AccessDenied. PUT: stored, 200. With ``refused_key`` set (an S3 error code), every request
    is 403 with that code (no body on a HEAD), as AWS answers a wrong secret or key id.
    """

    objects: dict[str, tuple[bytes, float]] = field(default_factory=dict)
    refused_key: str = ""
    asked: list[str] = field(default_factory=list)

    def _answer(self, method: str, path: str, body: bytes) -> tuple[int, dict[str, str], bytes]:
        self.asked.append(f"{method} {path}")
        if self.refused_key:
            return 403, {}, _error(self.refused_key)
        if method == "PUT":
            self.objects[path] = (body, time.time())
            return 200, {"ETag": f'"{hashlib.md5(body).hexdigest()}"'}, b""  # noqa: S324
        stored = self.objects.get(path)
        if stored is None:
            return 403, {}, _error("AccessDenied")
        data, written_s = stored
        meta = {
            "ETag": f'"{hashlib.md5(data).hexdigest()}"',  # noqa: S324 - S3's ETag is an MD5
            "Last-Modified": formatdate(written_s, usegmt=True),
            "Accept-Ranges": "bytes",
        }
        return 200, meta, data

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Answer one request, then close the connection (it says so)."""
        try:
            head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
            method, target = head.split(" ", 2)[:2]
            fields = {
                name.strip().lower(): value.strip()
                for name, _, value in (line.partition(":") for line in head.split("\r\n")[1:])
                if name
            }
            length = int(fields.get("content-length", "0"))
            body = await reader.readexactly(length) if length else b""
            status, meta, data = self._answer(method, urlsplit(target).path, body)
            sent = b"" if method == "HEAD" else data
            lines = [
                f"HTTP/1.1 {status} X",
                "Content-Type: application/xml" if status != 200 else "Content-Type: text/plain",
                "Connection: close",
                f"Content-Length: {len(data)}",
                *(f"{name}: {value}" for name, value in meta.items()),
            ]
            writer.write(("\r\n".join(lines) + "\r\n\r\n").encode() + sent)
            await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


@pytest.fixture
async def stand_in(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[LeastPrivilegeS3]:
    """The stand-in on a loopback port, named by AWS_ENDPOINT_URL."""
    served = LeastPrivilegeS3()
    server = await asyncio.start_server(served.serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "least-privilege")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "least-privilege-secret")
    monkeypatch.setenv("PIPELINE_OFFLOAD_TIMEOUT_S", "2")
    try:
        yield served
    finally:
        server.close()
        await server.wait_closed()


def _offloader(store: str = STORE, **options: float) -> Offloader:
    return Offloader({"up": OffloadPolicy(above=1024, store=store)}, **options)  # type: ignore[arg-type]


def _object_path(store: str, body: bytes) -> str:
    digest = hashlib.sha256(body).hexdigest()
    parts = urlsplit(store)
    return f"/{parts.netloc}{parts.path}/sha256/{digest[:2]}/{digest}"


async def test_a_new_payload_is_written_though_its_look_is_refused(
    stand_in: LeastPrivilegeS3,
) -> None:
    """The HEAD's 403 was an OffloadError: every new payload failed (a 503 at the ingress)."""
    offloader = _offloader()
    out = await offloader.offload("up", BODY, "application/json")
    assert out is not None
    assert stand_in.objects[_object_path(STORE, BODY)][0] == BODY
    assert offloader.counters.written == 1
    # The same payload again: its HEAD now finds it, nothing is written.
    again = await offloader.offload("up", BODY, "application/json")
    assert again is not None
    assert offloader.counters.reused == 1
    assert sum(asked.startswith("PUT ") for asked in stand_in.asked) == 1
    # And a member reads it back with the same key.
    body, headers = out
    payload = LazyPayload(ref.decode(body, headers), offloader.store(STORE))
    assert await payload.read() == BODY


async def test_a_payload_missing_to_such_a_key_is_retried_not_a_dead_letter(
    stand_in: LeastPrivilegeS3,
) -> None:
    """A missing object cannot be told from a refused read: a store failure, retried.

    The lane's retry tiers end in its dead-letter topic (``exhausted``) once it is out of
    attempts; the failure names the store's AccessDenied.
    """
    stand_in.objects[_object_path(STORE, BODY)] = (BODY, time.time())  # its reference, found
    offloader = _offloader()
    out = await offloader.offload("up", BODY, "application/json")
    assert out is not None
    stand_in.objects.clear()  # gone (purged, or never written to this bucket)
    body, headers = out
    with pytest.raises(OffloadError, match="403 Forbidden AccessDenied") as failed:
        await LazyPayload(ref.decode(body, headers), offloader.store(STORE)).read()
    assert default_retryable(failed.value)


@pytest.mark.parametrize("code", ["SignatureDoesNotMatch", "InvalidAccessKeyId"])
async def test_a_key_refused_whatever_it_asks_still_fails_the_write(
    stand_in: LeastPrivilegeS3, code: str
) -> None:
    """The refused HEAD says nothing; the PUT's answer names the refusal, as before."""
    stand_in.refused_key = code
    with pytest.raises(OffloadError, match=f"HTTP 403 {code} .*refused the credentials"):
        await _offloader().offload("up", BODY, "application/json")
    assert stand_in.objects == {}


async def test_an_old_object_purged_as_it_was_rewritten_is_written_once_more(
    stand_in: LeastPrivilegeS3,
) -> None:
    """The look after a rewrite of an old object: its refused HEAD means gone, so write it.

    Before, the look failed (a warning) and an object the purge deleted just after its rewrite
    stayed deleted while new references pointed to it.
    """
    path = _object_path(STORE, BODY)
    stand_in.objects[path] = (BODY, time.time() - 40 * 86_400)  # older than any purge floor

    async def purged_meanwhile(_: float) -> None:
        stand_in.objects.pop(path, None)  # the purge's delete, sent just after the rewrite

    offloader = _offloader()
    offloader.pause = purged_meanwhile
    assert await offloader.offload("up", BODY, "application/json") is not None
    await offloader.settle()
    assert stand_in.objects[path][0] == BODY
    assert sum(asked.startswith("PUT ") for asked in stand_in.asked) == 2


async def test_a_day_old_reference_to_a_missing_object_is_routed_on(
    stand_in: LeastPrivilegeS3, caplog: pytest.LogCaptureFixture
) -> None:
    """Producing such a reference again (a retry tier, the DLQ, a redrive) failed for ever.

    Its refused look was a store failure, and a reference written over ``refresh_after_s`` ago
    may not go out unchecked: the member's route failed, the message was redelivered, failed
    and was routed again without end. The read's AccessDenied now lets it go on, with a warning.
    """
    stand_in.objects[_object_path(STORE, BODY)] = (BODY, time.time())  # its reference, found
    out = await _offloader().offload("up", BODY, "application/json")
    assert out is not None
    stand_in.objects.clear()
    body, headers = out
    caplog.set_level(logging.WARNING, logger="pipeline.offload.writer")
    await _offloader(refresh_after_s=0).keep("up", body, headers)  # its object counts as old
    (line,) = [r.getMessage() for r in caplog.records]
    assert "AccessDenied" in line, line
    assert "goes out unchecked" in line, line
    stand_in.refused_key = "SignatureDoesNotMatch"  # a key refused whatever it asks: held
    with pytest.raises(OffloadError, match="SignatureDoesNotMatch"):
        await _offloader(refresh_after_s=0).keep("up", body, headers)


async def test_a_day_old_reference_to_an_object_still_there_rewrites_it(
    stand_in: LeastPrivilegeS3,
) -> None:
    """The object is found (HEAD 200 to such a key): read back and written again, as before."""
    stand_in.objects[_object_path(STORE, BODY)] = (BODY, time.time())  # its reference, found
    out = await _offloader().offload("up", BODY, "application/json")
    assert out is not None
    path = _object_path(STORE, BODY)
    stand_in.objects[path] = (BODY, time.time() - 2 * 86_400)
    keeper = _offloader()
    await keeper.keep("up", *out)
    assert keeper.counters.refreshed == 1
    assert time.time() - stand_in.objects[path][1] < 86_400


def _ingress(tmp_path: Path, store: str) -> tuple[IngressApp, SqliteLogStore]:
    spec = TopicSpec.model_validate(
        {"name": "big", "partitions": 1, "offload": {"store": store, "above": 1024}}
    )
    source = {"scheme": "meta", "secrets": [SECRET], "topic": "big"}
    path = tmp_path / "sources.yaml"
    path.write_text(yaml.safe_dump({"sources": {"hooks": source}}), encoding="utf-8")
    configs = load_sources(path, {"big"})
    built = build_sources(
        configs, [spec], admission=IngressSlotSettings(), max_message_bytes=1024 * 1024
    )
    log_store = SqliteLogStore(tmp_path / "ingress.db")
    app = IngressApp(built, log_store, None)
    offloader = Offloader({"big": OffloadPolicy(above=1024, store=store)})
    app.offload = functools.partial(offload_row, offloader)
    return app, log_store


async def _post(app: IngressApp) -> httpx.Response:
    headers = {"x-hub-signature-256": hub_signature(SECRET, BODY)}
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://i")
    async with client:
        return await client.post("/hooks/hooks", content=BODY, headers=headers)


async def test_the_ingress_accepts_a_new_payload_with_a_least_privilege_key(
    stand_in: LeastPrivilegeS3, tmp_path: Path
) -> None:
    """Every new payload was a 503 with such a key; it is accepted, its object written."""
    app, log_store = _ingress(tmp_path, STORE)
    await log_store.open()
    try:
        answer = await _post(app)
        assert answer.status_code == 200, answer.text
        assert answer.json()["status"] == "accepted"
        assert stand_in.objects[_object_path(STORE, BODY)][0] == BODY
        assert sum((await log_store.count_by_state(Selection())).values()) == 1
    finally:
        await log_store.close()


async def test_the_ingress_with_a_wrong_secret_on_s3proxy_is_still_a_503(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """S3Proxy's own refusal of a wrong secret: a 503 naming it, nothing stored."""
    for name, value in S3PROXY.items():
        if not os.environ.get(name):
            monkeypatch.setenv(name, value)
    endpoint = urlsplit(os.environ["AWS_ENDPOINT_URL"])
    require_service("s3proxy", endpoint.hostname or "127.0.0.1", endpoint.port or 9000)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", WRONG_SECRET)
    caplog.set_level(logging.ERROR, logger="pipeline.ingress.app")
    app, log_store = _ingress(tmp_path, f"s3://pipeline/least-{uuid.uuid4().hex[:10]}")
    await log_store.open()
    try:
        answer = await _post(app)
        assert answer.status_code == 503, answer.text
        (line,) = [r.getMessage() for r in caplog.records if "payload store" in r.getMessage()]
        assert "HTTP 403 SignatureDoesNotMatch" in line, line
        assert "refused the credentials" in line
        assert WRONG_SECRET not in line
        assert sum((await log_store.count_by_state(Selection())).values()) == 0
    finally:
        await log_store.close()
