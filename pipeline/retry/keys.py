"""Every Redis key the retry layer touches (the run guard and parking), in one place.

All keys of one lane share the hash tag ``{P:guard:LANE}``, so the guard's batched call over
many keys of a lane stays in one Redis Cluster slot; see ``lua/guard.lua`` for what each holds.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass

from pipeline.redis_keys import NAME_PART_MAX_BYTES, digest


def lane_tag(prefix: str, lane: str) -> str:
    """The hash tag every guard key of ``lane`` starts with."""
    return f"{{{prefix}:guard:{lane}}}"


_ENCODED: dict[bytes, str] = {}
_ENCODED_MAX = 65_536
_ENCODED_KEY_MAX_BYTES = 128
_BASE64_MAX_BYTES = NAME_PART_MAX_BYTES // 4 * 3
"""The longest key whose base64 form fits the bound (768 bytes: 1,024 characters)."""


def encode_key(key: bytes | None) -> str:
    """A message key as it appears in guard key names (url-safe base64: printable, no braces).

    Keys repeat (a conversation, a tenant), so the encodings of the last 65,536 keys of up to
    128 bytes are remembered (some 30 MiB at most); a longer key, which any producer may send,
    is encoded each time rather than kept. A key whose base64 form would be longer than
    :data:`~pipeline.redis_keys.NAME_PART_MAX_BYTES` (over 768 bytes) is named by its digest,
    ``#sha256:<hex>`` (:func:`~pipeline.redis_keys.digest`; ``#`` and ``:`` are no base64).
    """
    raw = key or b""
    if len(raw) > _BASE64_MAX_BYTES:
        return digest(raw)
    encoded = _ENCODED.get(raw)
    if encoded is None:
        encoded = base64.urlsafe_b64encode(raw).decode()
        if len(raw) <= _ENCODED_KEY_MAX_BYTES:
            if len(_ENCODED) >= _ENCODED_MAX:
                _ENCODED.clear()
            _ENCODED[raw] = encoded
    return encoded


@dataclass(frozen=True, slots=True)
class GuardKeys:
    """The lane-wide guard keys of one lane."""

    tag: str

    @property
    def run(self) -> str:
        """Start marks: message id -> ``starts|position[|route[|instance]]``."""
        return f"{self.tag}:run"

    @property
    def live(self) -> str:
        """Member processes that may still run a start: instance id -> liveness until (ms)."""
        return f"{self.tag}:live"

    def claims(self, topic: str, partition: int) -> str:
        """Offset ranges of one partition claimed by member processes: instance -> ``lo|hi``."""
        return f"{self.tag}:claims:{topic}:{partition}"

    @property
    def alone(self) -> str:
        """Lone starts of suspects."""
        return f"{self.tag}:alone"

    @property
    def gone(self) -> str:
        """Ids that left a parked key, with the time they left."""
        return f"{self.tag}:gone"

    @property
    def parked(self) -> str:
        """Keys that have parked messages."""
        return f"{self.tag}:parked"

    @property
    def releases(self) -> str:
        """Releases in progress, by lease expiry."""
        return f"{self.tag}:rel"

    @property
    def group(self) -> str:
        """The lane's group lease: the one group consuming the lane (``runtime/lane_lease.py``)."""
        return f"{self.tag}:group"

    def of_key(self, encoded: str) -> tuple[str, str, str]:
        """The parked zset, state hash and held-followers hash of one (encoded) key."""
        return f"{self.tag}:z:{encoded}", f"{self.tag}:h:{encoded}", f"{self.tag}:f:{encoded}"


def guard_keys(prefix: str, lane: str) -> GuardKeys:
    """The guard keys of ``lane`` under ``prefix``."""
    return GuardKeys(lane_tag(prefix, lane))
