"""The head of an HTTP/1.1 answer written by hand, as the project's own HTTP layers write it.

:mod:`pipeline.ingress.http` and :mod:`pipeline.observability.metrics_http` write their answers
straight to the transport, without uvicorn's protocols: the status line and headers come from
:func:`answer_head`, with the body's length and, when the connection ends, ``connection: close``.
"""

from __future__ import annotations

import http

Headers = list[tuple[bytes, bytes]]

TEXT_PLAIN = (b"content-type", b"text/plain; charset=utf-8")
"""The header of the short text answers (probes, refusals)."""

_STATUS = {
    code: b"HTTP/1.1 %d %s\r\n" % (code, http.HTTPStatus(code).phrase.encode())
    for code in (status.value for status in http.HTTPStatus)
}


def answer_head(status: int, headers: Headers, length: int, *, keep_alive: bool) -> list[bytes]:
    """The parts of the head of an answer of ``length`` body bytes (the body goes after)."""
    parts = [_STATUS.get(status) or b"HTTP/1.1 %d \r\n" % status]
    for name, value in headers:
        parts += (name, b": ", value, b"\r\n")
    parts += (b"content-length: ", str(length).encode(), b"\r\n")
    if not keep_alive:
        parts.append(b"connection: close\r\n")
    parts.append(b"\r\n")
    return parts
