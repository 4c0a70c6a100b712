"""Fixtures for the hostile-input tests: both registry stores, empty (``registry/stores.py``)."""

from registry.stores import pg_stores, store  # noqa: F401 - fixtures for this suite
