"""Each payload store keeps, streams, lists and deletes objects; a missing one is PayloadMissing."""

from __future__ import annotations

import asyncio
import hashlib
import os
import socket
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager

import pytest

from pipeline.errors import ConfigError
from pipeline.offload import reference as ref
from pipeline.offload.errors import OffloadError, PayloadCorrupt, PayloadMissing
from pipeline.offload.lazy import LazyPayload, read_body
from pipeline.offload.policy import OffloadPolicy
from pipeline.offload.store import open_store
from pipeline.offload.writer import Offloader


async def test_a_stored_object_reads_back_in_chunks_and_deletes(store_url: str) -> None:
    """What is put is listed, streams back byte for byte, and is gone after delete."""
    store = open_store(store_url)
    body = bytes(range(256)) * 12_000  # 3 MiB, several chunks
    await store.put("sha256/aa/one", body)
    head = await store.head("sha256/aa/one")
    assert head is not None
    assert head.size == len(body)
    chunks = [c async for c in store.chunks("sha256/aa/one", 1024 * 1024)]
    assert b"".join(chunks) == body
    assert [o.key async for o in store.list()] == ["sha256/aa/one"]
    await store.delete("sha256/aa/one")
    assert await store.head("sha256/aa/one") is None
    await store.delete("sha256/aa/one")  # deleting what is gone is no error


async def test_a_missing_object_is_payload_missing(store_url: str) -> None:
    """Reading an object that is not there raises PayloadMissing, a dead letter's reason."""
    store = open_store(store_url)
    with pytest.raises(PayloadMissing) as caught:
        [c async for c in store.chunks("sha256/bb/none", 1024)]
    assert caught.value.dead_reason == "payload_missing"


async def test_the_same_payload_is_written_once(store_url: str) -> None:
    """Offloading one body twice (a retry, a duplicate) writes one object and reuses it."""
    offloader = Offloader({"t": OffloadPolicy(above=1024, store=store_url)})
    body = b"x" * 300_000
    first = await offloader.offload("t", body, "application/json")
    again = await offloader.offload("t", body, "application/json")
    assert first is not None
    assert first == again
    assert (offloader.counters.written, offloader.counters.reused) == (1, 1)
    store = offloader.store(store_url)
    assert [o.key async for o in store.list()] == [ref.key_for(hashlib.sha256(body).hexdigest())]
    assert await offloader.offload("t", b"small") is None  # at or below the threshold: inline


async def test_a_lazy_payload_checks_the_digest(store_url: str) -> None:
    """A LazyPayload reads the body once with its digest checked; a wrong one is corrupt."""
    store = open_store(store_url)
    body = b"payload" * 50_000
    good = ref.reference_for(store_url, body, "text/plain")
    await store.put(good.key, body)
    lazy = LazyPayload(good, store)
    assert (lazy.size, lazy.content_type, len(lazy)) == (len(body), "text/plain", len(body))
    assert await read_body(lazy) == body
    assert b"".join([c async for c in lazy.chunks(65_536)]) == body
    other = ref.reference_for(store_url, b"something else")
    await store.put(other.key, body)  # the wrong bytes under a digest's key
    with pytest.raises(PayloadCorrupt):
        await LazyPayload(other, store).read()


@pytest.mark.parametrize("unsigned", [None, "false"])
async def test_s3_writes_with_and_without_a_signed_payload(
    store_url: str, unsigned: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Unsigned payloads by default; AWS_UNSIGNED_PAYLOAD=false signs them: both are stored."""
    if not store_url.startswith("s3://"):
        pytest.skip("a directory store signs nothing")
    if unsigned is None:
        monkeypatch.delenv("AWS_UNSIGNED_PAYLOAD", raising=False)
    else:
        monkeypatch.setenv("AWS_UNSIGNED_PAYLOAD", unsigned)
    store = open_store(store_url)
    body = b"s" * 300_000
    await store.put("sha256/bb/signed", body)
    assert b"".join([c async for c in store.chunks("sha256/bb/signed", 1 << 20)]) == body
    await store.delete("sha256/bb/signed")
    monkeypatch.delenv("AWS_UNSIGNED_PAYLOAD", raising=False)


async def test_an_object_larger_than_its_reference_is_corrupt_before_it_is_read_whole(
    store_url: str,
) -> None:
    """Reading stops at the first byte past the reference's size: PayloadCorrupt, nothing more."""
    store = open_store(store_url)
    reference = ref.reference_for(store_url, b"r" * 1000)
    await store.put(reference.key, b"y" * (8 * 1024 * 1024))  # far larger than referenced
    pulled: list[int] = []

    class Counting:
        url = store.url

        async def chunks(self, key: str, chunk_bytes: int) -> AsyncIterator[bytes]:
            async for chunk in store.chunks(key, chunk_bytes):
                pulled.append(len(chunk))
                yield chunk

    yielded = 0

    async def stream() -> None:
        nonlocal yielded
        async for chunk in LazyPayload(reference, Counting()).chunks(65_536):  # type: ignore[arg-type]
            yielded += len(chunk)

    with pytest.raises(PayloadCorrupt, match="more than the 1000 bytes"):
        await stream()
    assert yielded <= reference.size
    assert len(pulled) == 1  # not streamed to its end
    with pytest.raises(PayloadCorrupt):
        await LazyPayload(reference, store).read()


async def test_a_store_that_is_down_fails_in_one_line(s3_down_port: int) -> None:
    """S3 down: each failed call is one OffloadError line naming the store, the call and the URL."""
    port = s3_down_port
    store = open_store("s3://pipeline/down")
    with pytest.raises(OffloadError) as written:
        await store.put("sha256/aa/one", b"x")
    with pytest.raises(OffloadError) as listed:
        [o async for o in store.list()]
    for caught, what in ((written, "cannot write sha256/aa/one"), (listed, "cannot list")):
        text = str(caught.value)
        assert "\n" not in text
        assert f"offload store s3://pipeline/down: {what}: " in text
        assert f"127.0.0.1:{port}" in text


async def test_missing_credentials_fail_in_one_line_that_says_so(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No AWS credentials: one OffloadError line saying which variables to set, no debug dump."""
    if not store_url.startswith("s3://"):
        pytest.skip("a directory store needs no credentials")
    with monkeypatch.context() as env:  # the fixture's cleanup needs them back
        for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
            env.delenv(name, raising=False)
        with pytest.raises(OffloadError) as caught:
            await open_store(store_url).head("sha256/aa/one")
    text = str(caught.value)
    assert "\n" not in text
    assert "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY" in text


@contextmanager
def black_hole() -> Iterator[int]:
    """A loopback port that accepts connections and never reads or answers; its port."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    held: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                held.append(server.accept()[0])
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield server.getsockname()[1]
    finally:
        server.close()
        for conn in held:
            conn.close()


@asynccontextmanager
async def trickling_relay(target_port: int, slice_bytes: int, pause_s: float) -> AsyncIterator[int]:
    """A loopback relay to ``target_port``; requests pass ``slice_bytes`` per ``pause_s``."""

    async def pipe(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, pause: float
    ) -> None:
        try:
            while data := await reader.read(slice_bytes):
                writer.write(data)
                await writer.drain()
                await asyncio.sleep(pause)
        except OSError:
            pass
        finally:
            writer.close()

    async def relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", target_port)
        await asyncio.gather(pipe(reader, up_writer, pause_s), pipe(up_reader, writer, 0.0))

    # A small receive window, so the writer's bytes wait on the relay, not in socket buffers.
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, slice_bytes)
    listener.bind(("127.0.0.1", 0))
    server = await asyncio.start_server(relay, sock=listener, limit=slice_bytes)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()


async def test_a_black_holed_store_fails_within_its_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A store that takes connections and never answers fails each call in one line, timed out."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "pipeline")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "pipeline-local-secret")
    monkeypatch.setenv("PIPELINE_OFFLOAD_TIMEOUT_S", "1")
    with black_hole() as port:
        monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
        store = open_store("s3://pipeline/black-hole")
        calls = (
            ("cannot write sha256/aa/one", store.put("sha256/aa/one", b"x" * 300_000)),
            ("cannot read sha256/aa/one", store.head("sha256/aa/one")),
        )
        for what, call in calls:
            with pytest.raises(OffloadError) as caught:
                await asyncio.wait_for(call, 20.0)  # the client's own default was 30 s
            text = str(caught.value)
            assert "\n" not in text
            assert f"offload store s3://pipeline/black-hole: {what}: " in text
            assert "no answer within 1 s (PIPELINE_OFFLOAD_TIMEOUT_S)" in text


@pytest.mark.parametrize("unsigned", [None, "true"])
async def test_a_large_upload_still_flowing_outlasts_the_timeout(
    store_url: str, unsigned: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A multi-MiB write whose bytes keep flowing completes, though longer than the timeout.

    ``AWS_UNSIGNED_PAYLOAD=true`` is the default said aloud: bodies unsigned, sent in slices.
    """
    if not store_url.startswith("s3://"):
        pytest.skip("a directory store has no network timeout")
    endpoint = os.environ["AWS_ENDPOINT_URL"]
    monkeypatch.setenv("PIPELINE_OFFLOAD_TIMEOUT_S", "1")
    if unsigned is None:
        monkeypatch.delenv("AWS_UNSIGNED_PAYLOAD", raising=False)
    else:
        monkeypatch.setenv("AWS_UNSIGNED_PAYLOAD", unsigned)
    body = os.urandom(4 * 1024 * 1024)
    # 64 slices of 64 KiB, each followed by 50 ms: the write takes over 3 s, never 1 s idle.
    async with trickling_relay(int(endpoint.rsplit(":", 1)[1]), 64 * 1024, 0.05) as relay_port:
        with monkeypatch.context() as env:  # the fixture's cleanup goes to the store itself
            env.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{relay_port}")
            await open_store(store_url).put("sha256/aa/big", body)
    chunks = [chunk async for chunk in open_store(store_url).chunks("sha256/aa/big", 1 << 20)]
    assert b"".join(chunks) == body


async def test_a_read_taken_slowly_outlasts_the_timeout(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A payload read in chunks over longer than the timeout completes: only a stall fails."""
    if not store_url.startswith("s3://"):
        pytest.skip("a directory store has no network timeout")
    monkeypatch.setenv("PIPELINE_OFFLOAD_TIMEOUT_S", "1")
    store = open_store(store_url)
    body = os.urandom(4 * 1024 * 1024)
    await store.put("sha256/aa/slow", body)
    chunks = []
    async for chunk in store.chunks("sha256/aa/slow", 1024 * 1024):
        chunks.append(chunk)
        await asyncio.sleep(0.6)  # a handler feeding a slow sink: 2.4 s in all
    assert b"".join(chunks) == body


@pytest.mark.parametrize("value", ["0", "-1", "soon", "301"])
def test_a_bad_timeout_is_refused_naming_the_variable(
    value: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A PIPELINE_OFFLOAD_TIMEOUT_S not in (0, 300] seconds is refused in one line naming it."""
    monkeypatch.setenv("PIPELINE_OFFLOAD_TIMEOUT_S", value)
    with pytest.raises(ConfigError) as caught:
        open_store("s3://pipeline/any")
    assert "PIPELINE_OFFLOAD_TIMEOUT_S" in str(caught.value)
    assert repr(value) in str(caught.value)


@asynccontextmanager
async def counting_relay(
    target_port: int, *, one_answer_each: bool = False
) -> AsyncIterator[list[int]]:
    """A loopback relay to ``target_port``: ``[port, connections accepted]``.

    ``one_answer_each``: a connection that has relayed an answer is closed, unanswered, when the
    next request arrives on it (a server closing a kept-alive connection as it is reused).
    """
    accepted = [0, 0]

    async def relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted[1] += 1
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", target_port)
        answered = False

        async def upward() -> None:
            while data := await reader.read(65_536):
                if answered and one_answer_each:
                    break
                up_writer.write(data)
                await up_writer.drain()
            up_writer.close()
            writer.close()

        async def downward() -> None:
            nonlocal answered
            while data := await up_reader.read(65_536):
                answered = True
                writer.write(data)
                await writer.drain()
            writer.close()

        try:
            await asyncio.gather(upward(), downward())
        except OSError:
            pass
        finally:
            up_writer.close()
            writer.close()

    server = await asyncio.start_server(relay, "127.0.0.1", 0)
    accepted[0] = server.sockets[0].getsockname()[1]
    try:
        yield accepted
    finally:
        server.close()


@pytest.mark.parametrize("closed_by_server", [False, True])
async def test_sequential_s3_writes_and_deletes_reuse_connections(
    store_url: str, closed_by_server: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ten writes then ten deletes share kept-alive connections; one the server closed is retried.

    Each write and each delete opened (and left in TIME_WAIT) a TCP connection of its own, a
    handshake per object and ephemeral ports used up under a burst of large webhooks.
    """
    if not store_url.startswith("s3://"):
        pytest.skip("a directory store has no connections")
    monkeypatch.delenv("AWS_UNSIGNED_PAYLOAD", raising=False)
    endpoint = os.environ["AWS_ENDPOINT_URL"]
    target = int(endpoint.rsplit(":", 1)[1])
    async with counting_relay(target, one_answer_each=closed_by_server) as relay:
        with monkeypatch.context() as env:  # the fixture's cleanup goes to the store itself
            env.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{relay[0]}")
            store = open_store(store_url)
            keys = [f"sha256/cc/{n}" for n in range(10)]
            for key in keys:
                await store.put(key, key.encode() * 40_000)
            for key in keys:
                await store.delete(key)
    assert [o.key async for o in open_store(store_url).list("sha256/cc/")] == []
    # Kept alive, one connection serves them all; closed after each answer, one per request.
    assert relay[1] == (20 if closed_by_server else 1)


async def test_a_listing_hands_out_each_page_before_reading_the_next(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first object comes before the last pages are read: memory stays a page deep.

    The S3 listing read every page into one list first, so a purge of a store with a million
    payloads held about 0.85 KB per object before it deleted any.
    """
    if not store_url.startswith("s3://"):
        pytest.skip("a directory store lists its directories as it walks them")
    import obstore  # noqa: PLC0415 - only the S3 store's client

    store = open_store(store_url)
    for n in range(6):
        await store.put(f"sha256/cc/{n}", b"x")
    pages_read = 0
    real_list = obstore.list

    def list_in_pages_of_two(*args: object, **kwargs: object) -> Iterator[object]:
        nonlocal pages_read
        for page in real_list(*args, **{**kwargs, "chunk_size": 2}):  # type: ignore[arg-type]
            pages_read += 1
            yield page

    monkeypatch.setattr(obstore, "list", list_in_pages_of_two)
    listing = store.list()
    first = await anext(listing)
    read_before_first = pages_read
    rest = [obj.key async for obj in listing]
    assert sorted([first.key, *rest]) == [f"sha256/cc/{n}" for n in range(6)]
    assert read_before_first < pages_read  # the later pages were read after the first object
