"""Row ids: unique across replicas, and time-ordered so new rows append to the index."""

from __future__ import annotations

import os
import time


def new_row_id(now_s: float | None = None) -> str:
    """A 26-character hex id: milliseconds since the epoch, then 64 random bits.

    Ids sort by creation time (to the millisecond), which keeps inserts at the right edge of the
    primary-key index and lets ``pipeline replay`` page through rows in arrival order.
    """
    now_ms = int((time.time() if now_s is None else now_s) * 1000)
    return f"{now_ms:010x}{os.urandom(8).hex()}"
