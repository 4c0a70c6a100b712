"""A CPU-bound handler whose module takes 60 s to import (a call made at import time hangs)."""

from __future__ import annotations

import time

time.sleep(60)  # the worker importing this is killed at the pool's import limit long before


def never(lane: str) -> None:
    """Never reached: its module does not finish importing."""
