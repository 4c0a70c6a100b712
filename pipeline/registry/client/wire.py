"""The Confluent wire format: ``0x00``, the schema id as 4 bytes big-endian, then the Avro body.

This is the framing ``confluent_kafka``'s Avro serializers write and read, so messages cross
freely between them and :mod:`pipeline.registry.client.serde`.
"""

from __future__ import annotations

import struct

from pipeline.registry.errors import SerdeError

MAGIC_BYTE = 0
HEADER_BYTES = 5
_HEADER = struct.Struct(">bI")
_MAX_ID = 2**32 - 1


def header(schema_id: int) -> bytes:
    """The 5-byte prefix for a message written with schema ``schema_id``.

    Raises:
        SerdeError: the id does not fit in 4 unsigned bytes.
    """
    if not 0 <= schema_id <= _MAX_ID:
        raise SerdeError(f"schema id {schema_id} does not fit the wire format")
    return _HEADER.pack(MAGIC_BYTE, schema_id)


def schema_id_of(message: bytes) -> int:
    """The schema id a framed message was written with.

    Raises:
        SerdeError: the message is too short or does not start with the magic byte.
    """
    if len(message) < HEADER_BYTES or message[0] != MAGIC_BYTE:
        raise SerdeError(
            "not a schema-registry framed message: expected magic byte 0 and a 4-byte schema id, "
            f"got {bytes(message[:HEADER_BYTES])!r} ({len(message)} bytes)"
        )
    return int(_HEADER.unpack_from(message)[1])
