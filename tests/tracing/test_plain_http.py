"""The exporting process's plain-HTTP transport, against real servers on loopback sockets."""

from __future__ import annotations

import io
import socket
import threading
from collections.abc import Callable, Iterator

import pytest
from opentelemetry.exporter.otlp.common.http import _OTLPHTTPClient
from tracing.otlp_receiver import OtlpReceiver

from pipeline.tracing import otlp as wire
from pipeline.tracing.plain_http import ConnectFailedError, PlainHTTPTransport

TRACE_ID = bytes.fromhex("4bf92f3577b34da6a3ce929d0e0e4736")
HEADERS = {"content-type": "application/x-protobuf"}


def _request(name: str) -> bytes:
    span = wire.span(TRACE_ID, 7, 0, name, 1, 1_000, 2_000, {"pipeline.lane": "orders"})
    return wire.request({"service.name": "pipeline-test"}, "pipeline", [span])


class RawServer:
    """A loopback server that reads each request whole and answers it with ``reply``.

    ``reply`` gets the number of the request (from 1, over all connections) and returns the
    bytes to send, or None to send nothing and keep reading; ``close_after`` closes each
    connection after that many answers.
    """

    def __init__(self, reply: Callable[[int], bytes | None], close_after: int = 0) -> None:
        """Listen on a free port, serving each connection in a daemon thread."""
        self.reply = reply
        self.close_after = close_after
        self.connections = 0
        self.requests = 0
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        """The URL requests go to."""
        return f"http://127.0.0.1:{self.port}/v1/traces"

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn, conn.makefile("rb") as stream:
            answered = 0
            while True:
                length = self._read_head(stream)
                if length is None:
                    return
                stream.read(length)
                self.requests += 1
                answer = self.reply(self.requests)
                if answer is None:
                    continue
                conn.sendall(answer)
                answered += 1
                if self.close_after and answered >= self.close_after:
                    return

    @staticmethod
    def _read_head(stream: io.BufferedReader) -> int | None:
        length = 0
        while True:
            line = stream.readline()
            if not line:
                return None
            if line in (b"\r\n", b"\n"):
                return length
            name, _, value = line.decode("latin-1").partition(":")
            if name.strip().lower() == "content-length":
                length = int(value.strip())

    def close(self) -> None:
        """Stop accepting."""
        self._listener.close()


@pytest.fixture
def transport() -> Iterator[PlainHTTPTransport]:
    """A transport, its connections closed afterwards."""
    made = PlainHTTPTransport()
    yield made
    made.close()


def _ok(_number: int) -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"


def test_requests_share_one_kept_connection(
    otlp: OtlpReceiver, transport: PlainHTTPTransport
) -> None:
    """Three exports to a real OTLP receiver: each arrives whole, all over one connection."""
    for name in ("first", "second", "third"):
        result = transport.request(
            "POST", otlp.endpoint, headers=HEADERS, timeout=5, data=_request(name)
        )
        assert result.status_code == 200
        assert result.error is None
    assert [span.name for span in otlp.spans] == ["first", "second", "third"]
    assert len(set(otlp.peers)) == 1
    assert otlp.headers[0]["content-type"] == "application/x-protobuf"


def test_a_connection_the_collector_closed_is_made_again(transport: PlainHTTPTransport) -> None:
    """A kept connection the server closed fails as a connection error; the next one is new.

    Through the SDK's client, which retries a connection error once at once, every export
    succeeds.
    """
    server = RawServer(_ok, close_after=1)
    try:
        assert transport.request("POST", server.url, data=b"x", timeout=5).status_code == 200
        stale = transport.request("POST", server.url, data=b"x", timeout=5)
        assert stale.status_code is None
        assert transport.is_connection_error(stale.error)
        assert transport.request("POST", server.url, data=b"x", timeout=5).status_code == 200
        assert server.connections == 2

        client = _OTLPHTTPClient(transport, server.url, "spans", timeout=5, headers=HEADERS)
        assert all(client.export(_request("again")).success for _ in range(3))
    finally:
        server.close()


def test_a_collector_that_is_down_fails_the_request_without_raising(
    transport: PlainHTTPTransport,
) -> None:
    """Nothing listens on the port: the result carries a connection error, nothing raises."""
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    result = transport.request("POST", f"http://127.0.0.1:{port}/v1/traces", data=b"x", timeout=1)
    assert isinstance(result.error, ConnectFailedError)
    assert f"127.0.0.1:{port}" in str(result.error)
    assert transport.is_connection_error(result.error)


def test_an_answer_and_its_headers_are_read_whole(transport: PlainHTTPTransport) -> None:
    """A 503 with ``Retry-After`` (looked up in any case) and a body, as the client reads them."""

    def busy(_number: int) -> bytes:
        body = b"collector busy"
        return (
            b"HTTP/1.1 503 Service Unavailable\r\nretry-after: 7\r\nX-Note: a\r\nX-Note: b\r\n"
            b"Content-Length: %d\r\n\r\n%b" % (len(body), body)
        )

    server = RawServer(busy)
    try:
        result = transport.request("POST", server.url, data=b"x", timeout=5)
    finally:
        server.close()
    assert (result.status_code, result.reason, result.content()) == (
        503,
        "Service Unavailable",
        b"collector busy",
    )
    assert result.headers().get("Retry-After") == "7"
    assert result.headers()["retry-after"] == "7"
    assert result.headers()["x-note"] == "a, b"
    assert result.error is None


def test_an_answer_that_never_comes_times_out_and_is_not_a_connection_error(
    transport: PlainHTTPTransport,
) -> None:
    """The connection works but no answer comes in time: a timeout, the connection dropped."""
    server = RawServer(lambda number: None if number == 1 else _ok(number))
    try:
        silent = transport.request("POST", server.url, data=b"x", timeout=0.2)
        assert isinstance(silent.error, TimeoutError)
        assert not transport.is_connection_error(silent.error)
        assert transport.request("POST", server.url, data=b"x", timeout=5).status_code == 200
        assert server.connections == 2
    finally:
        server.close()


def test_only_plain_http_urls_are_taken(transport: PlainHTTPTransport) -> None:
    """A TLS endpoint is the SDK's urllib3 transport's: this one refuses it in one line."""
    with pytest.raises(ValueError, match="http:// URLs only"):
        transport.request("POST", "https://collector.example/v1/traces", data=b"x")
