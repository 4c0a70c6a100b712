"""The SQLite log store (the embedded default): WAL, group commit, one writer thread."""

from pipeline.logstore.sqlite.store import SqliteLogStore

__all__ = ["SqliteLogStore"]
