"""Every Redis key the retry layer touches (parking and poison counters), in one place.

All keys of one (lane, key) share the hash tag ``{P:park:LANE:KEY}`` so one function call
stays in one Redis Cluster slot; see ``lua/parking.lua`` for what each holds.
"""

from __future__ import annotations

import base64


def _tag(prefix: str, lane: str, key: bytes | None) -> str:
    # Keys are arbitrary bytes: url-safe base64 keeps them printable and free of braces.
    encoded = base64.urlsafe_b64encode(key or b"").decode()
    return f"{{{prefix}:park:{lane}:{encoded}}}"


def parking_keys(prefix: str, lane: str, key: bytes | None, message_id: str) -> list[str]:
    """The parked zset, parking hash, run counter, gone set and lone-start counter."""
    tag = _tag(prefix, lane, key)
    return [f"{tag}:z", f"{tag}:h", f"{tag}:r:{message_id}", f"{tag}:gone", f"{tag}:a:{message_id}"]
