"""Hostile message keys in the run guard's parking key names (``pipeline/retry/keys.py``)."""

from __future__ import annotations

import tracemalloc

from pipeline.retry import keys


def test_huge_distinct_keys_are_not_kept_in_the_encoding_cache():
    """Encoding many distinct 64 KiB message keys retains no memory for them."""
    keys.encode_key(b"warm")  # the cache exists before the measure
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for n in range(100):
            raw = n.to_bytes(2, "big") + b"\xff{}:\n\x00" * 10_923  # 64 KiB, one per message
            assert keys.encode_key(raw) == keys.encode_key(raw)
        retained = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert retained < 1 << 20, f"{retained} bytes kept for 100 keys"
