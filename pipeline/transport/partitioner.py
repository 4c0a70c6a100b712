"""Java-compatible key partitioning: the partition a key maps to is the one a Java producer picks.

Kafka's default partitioner hashes a key with murmur2 (``org.apache.kafka.common.utils.Utils``)
and takes ``toPositive(hash) % partitions``; librdkafka does the same with
``partitioner=murmur2_random``. The Redis Streams transport uses this function so one key lands on
the same partition number on both transports.
"""

from __future__ import annotations

from functools import lru_cache

_M = 0x5BD1E995
_SEED = 0x9747B28C
_MASK = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 hash of ``data`` as a signed 32-bit integer (as Java returns it)."""
    length = len(data)
    h = (_SEED ^ length) & _MASK
    full = length - length % 4
    for i in range(0, full, 4):
        k = int.from_bytes(data[i : i + 4], "little")
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = (h * _M) & _MASK
        h ^= k
    rest = length % 4
    if rest == 3:  # noqa: PLR2004 - the three tail cases of murmur2
        h ^= data[full + 2] << 16
    if rest >= 2:  # noqa: PLR2004
        h ^= data[full + 1] << 8
    if rest >= 1:
        h ^= data[full]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


_CACHED_KEY_BYTES = 128
"""Longer keys are hashed each time: 65,536 remembered keys of any size could hold gigabytes."""


def partition_for(key: bytes, partitions: int) -> int:
    """The partition of ``key`` among ``partitions``: ``toPositive(murmur2(key)) % partitions``.

    Remembered for the most recent 65,536 keys of up to 128 bytes: the same contacts and
    tenants come back all the time, and the pure-Python hash costs more than verifying a
    webhook's signature.
    """
    if len(key) <= _CACHED_KEY_BYTES:
        return _remembered(key, partitions)
    return _partition(key, partitions)


@lru_cache(maxsize=65_536)
def _remembered(key: bytes, partitions: int) -> int:
    return _partition(key, partitions)


def _partition(key: bytes, partitions: int) -> int:
    if partitions < 1:
        raise ValueError(f"partitions must be >= 1, got {partitions}")
    return (murmur2(key) & 0x7FFFFFFF) % partitions
