"""What the project's HTTP/1.1 protocols share: a connection admitted under a bound, then let go.

Both HTTP layers plug a protocol into uvicorn's server (``uvicorn.Config(http=...)``): the
ingress's webhook port (:mod:`pipeline.ingress.http`) and the metrics ports
(:mod:`pipeline.observability.metrics_http`). Each connection is admitted under the server's
:class:`~pipeline.observability.connections.OpenConnections` bound (or closed at once) and kept
in uvicorn's set of open connections, which its shutdown closes; when it is lost it leaves both
and reads nothing more. :class:`BoundedProtocol` does that once for both.
"""

from __future__ import annotations

import asyncio
from typing import Any, cast

from pipeline.observability.connections import OpenConnections


class BoundedProtocol(asyncio.Protocol):
    """A client connection counted under ``connections`` (set on the class by its factory)."""

    connections: OpenConnections[Any]

    def __init__(self, server_state: Any, loop: asyncio.AbstractEventLoop | None) -> None:
        """Not connected yet; ``server_state.connections`` is uvicorn's set of open connections."""
        self._loop = loop or asyncio.get_event_loop()
        self._connections: set[Any] = server_state.connections
        self._transport: asyncio.Transport | None = None
        self.admitted = False  # counted under the bound: set and cleared by ``connections``
        self._stopped = False  # nothing more is read

    def _admit(self, transport: asyncio.BaseTransport) -> bool:
        """Count the connection under the bound and for uvicorn's shutdown; False if refused.

        A connection refused (past the bound, with none to evict) is closed and reads nothing.
        """
        self._transport = cast("asyncio.Transport", transport)  # a stream server's (uvloop's)
        if not self.connections.admit(self):
            self._stopped = True
            self._transport.close()
            return False
        self._connections.add(self)
        return True

    def _let_go(self) -> None:
        """The connection is lost: it no longer counts, nor is closed at shutdown; reads stop."""
        self.connections.leave(self)
        self._connections.discard(self)
        self._stopped = True

    def _drop(self) -> None:
        """Close the transport now; output the client has not read is dropped.

        A transport closed with output still buffered keeps its descriptor until the client
        reads it, and a client that reads nothing would keep it for ever: such a transport is
        aborted instead.
        """
        transport = self._transport
        if transport is None:
            return
        if transport.get_write_buffer_size():
            transport.abort()
        elif not transport.is_closing():
            transport.close()
