"""What listens at a Kafka bootstrap address: a broker's listener, a controller's, or neither.

A bootstrap address that accepts a connection but never gives metadata only times out in
librdkafka ("Failed while waiting for controller: Local: Timed out"), which reads like a Kafka
that is down. :func:`listener_kind` asks the address itself, with Kafka's ``ApiVersions``
request (v0, which every Kafka listener answers before any login): a broker's client listener
offers the Metadata API, a KRaft controller's listener (``controller.listener.names``, 9093 in
``make services``) does not, and anything else answers no Kafka response at all. A listener
that accepts and says nothing is ``unknown``: a broker that hangs does that too.
"""

from __future__ import annotations

import asyncio
import struct
from typing import Literal

__all__ = ["ListenerKind", "listener_kind", "split_address"]

ListenerKind = Literal["broker", "controller", "other", "unknown"]

_API_VERSIONS = 18
_METADATA = 3
_CORRELATION_ID = 0x706C
_CLIENT_ID = b"pipeline-probe"
_MAX_RESPONSE_BYTES = 1 << 16
_HEADER = struct.Struct(">ihi")  # correlation id, error code, number of APIs
_API = struct.Struct(">hhh")  # api key, min version, max version


def split_address(entry: str) -> tuple[str, int] | None:
    """``[proto://]host[:port]`` as (host, port), librdkafka's 9092 without one; None if bad."""
    address = entry.strip().split("://", 1)[-1]
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        host, port = address, "9092"
    host = host.removeprefix("[").removesuffix("]")
    return (host, int(port)) if host else None


async def listener_kind(host: str, port: int, timeout_s: float) -> ListenerKind | None:
    """What answers a plaintext ``ApiVersions`` request at ``host:port``; None: no connection.

    ``other`` is an answer that is no Kafka response, or the connection closed at once (no
    Kafka listener closes on ``ApiVersions`` v0): another service, or a listener that expects
    TLS first. ``unknown`` is no answer within ``timeout_s`` after the connection was
    accepted: a hung, paused or overloaded broker does that as well as another service, so it
    tells nothing. Each step waits at most ``timeout_s``; the connection is dropped, not
    closed politely (a peer that reads nothing would hold a graceful close).
    """
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout_s)
    except (OSError, TimeoutError, ValueError):
        return None
    try:
        body = struct.pack(">hhih", _API_VERSIONS, 0, _CORRELATION_ID, len(_CLIENT_ID))
        writer.write(struct.pack(">i", len(body) + len(_CLIENT_ID)) + body + _CLIENT_ID)
        await asyncio.wait_for(writer.drain(), timeout_s)
        (size,) = struct.unpack(">i", await asyncio.wait_for(reader.readexactly(4), timeout_s))
        if not _HEADER.size <= size <= _MAX_RESPONSE_BYTES:
            return "other"
        data = await asyncio.wait_for(reader.readexactly(size), timeout_s)
    except TimeoutError:
        return "unknown"  # silence (or a reply cut short by it) is no verdict
    except (OSError, asyncio.IncompleteReadError):
        return "other"
    finally:
        writer.transport.abort()
    return _kind(data)


def _kind(data: bytes) -> ListenerKind:
    """The listener an ``ApiVersions`` v0 response ``data`` (without its size) comes from."""
    correlation, error, count = _HEADER.unpack_from(data)
    if correlation != _CORRELATION_ID or error != 0 or not 0 <= count <= 1000:  # noqa: PLR2004
        return "other"
    if len(data) < _HEADER.size + count * _API.size:
        return "other"
    keys = {_API.unpack_from(data, _HEADER.size + i * _API.size)[0] for i in range(count)}
    return "broker" if _METADATA in keys else "controller"
