"""Fixtures the runtime suites share: a key prefix and lanes of the test's own, removed after."""

from runtime.owned import lanes, prefix

__all__ = ["lanes", "prefix"]
