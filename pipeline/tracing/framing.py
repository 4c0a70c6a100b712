"""The framing of record batches from the traced process to the exporting one.

The traced process's thread (:mod:`.shipper`) writes each batch as one length-prefixed
``marshal`` of a list of :mod:`.record` tuples (:func:`frame`); the exporting process reads them
back whole (:class:`FrameReader`), as bytes it unmarshals when it encodes them.
"""

from __future__ import annotations

import marshal
import os
import select
import struct

from pipeline.tracing.record import Record

HEADER = struct.Struct(">I")
"""A batch's length in bytes, before it."""
READ_BYTES = 1 << 20


def frame(records: list[Record]) -> bytes:
    """``records`` as one write to the exporting process: its length, then the marshalled list.

    What :class:`FrameReader` reads back; ``marshal.loads`` of a body gives ``records``.
    """
    body = marshal.dumps(records)  # the same interpreter reads it; no code, no memo
    return HEADER.pack(len(body)) + body


class FrameReader:
    """Length-prefixed batches (:func:`frame`) read from a file descriptor, as their bodies."""

    __slots__ = ("_fd", "_pending")

    def __init__(self, fd: int) -> None:
        """Read from ``fd`` (the exporting process's standard input)."""
        self._fd = fd
        self._pending = bytearray()

    def read(self, timeout_s: float | None) -> list[bytes] | None:
        """The whole batches that arrived within ``timeout_s``; None once the input ended.

        ``timeout_s`` None waits for input. A batch cut short by the end is not returned.
        """
        ready, _, _ = select.select([self._fd], [], [], timeout_s)
        if not ready:
            return []
        chunk = os.read(self._fd, READ_BYTES)
        if not chunk:
            return None
        pending = self._pending
        pending += chunk
        bodies: list[bytes] = []
        start = 0
        while len(pending) - start >= HEADER.size:
            (size,) = HEADER.unpack_from(pending, start)
            end = start + HEADER.size + size
            if len(pending) < end:
                break
            bodies.append(bytes(pending[start + HEADER.size : end]))
            start = end
        del pending[:start]
        return bodies
