"""Fixtures the cancellation suites share with the runtime's: a key prefix and lanes, removed."""

from runtime.owned import lanes, prefix

__all__ = ["lanes", "prefix"]
