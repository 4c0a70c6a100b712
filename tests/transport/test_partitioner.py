"""Java-compatible murmur2 partitioning."""

from __future__ import annotations

import tracemalloc

import pytest

from pipeline.transport.partitioner import murmur2, partition_for

# Apache Kafka's own vectors, org.apache.kafka.common.utils.UtilsTest#testMurmur2.
KAFKA_VECTORS = {
    b"21": -973932308,
    b"foobar": -790332482,
    b"a-little-bit-long-string": -985981536,
    b"a-little-bit-longer-string": -1486304829,
    b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    b"abc": 479470107,
}


@pytest.mark.parametrize(("data", "expected"), KAFKA_VECTORS.items())
def test_murmur2_matches_kafka_utils_test(data: bytes, expected: int) -> None:
    """murmur2 returns the signed 32-bit hash Kafka's Java Utils.murmur2 returns."""
    assert murmur2(data) == expected


def test_partition_uses_to_positive_modulo() -> None:
    """The partition is toPositive(hash) % count, as Kafka's BuiltInPartitioner computes it."""
    assert partition_for(b"foobar", 50) == (-790332482 & 0x7FFFFFFF) % 50 == 16


def test_partition_count_must_be_positive() -> None:
    """Zero partitions is a programming error, reported clearly."""
    with pytest.raises(ValueError, match="partitions must be >= 1"):
        partition_for(b"k", 0)


def test_long_keys_are_not_kept_in_the_partition_cache() -> None:
    """Partitioning many distinct 8 KiB keys retains no memory for them."""
    partition_for(b"warm", 4)  # the cache exists before the measure
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for n in range(100):
            partition_for(n.to_bytes(2, "big") + b"k" * 8_190, 12)  # 8 KiB, one per message
        retained = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert retained < 100 << 10, f"{retained} bytes kept for 100 keys of 8 KiB"
    assert partition_for(b"k" * 200, 7) == (murmur2(b"k" * 200) & 0x7FFFFFFF) % 7
