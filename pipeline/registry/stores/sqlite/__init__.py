"""The embedded registry store on one SQLite file."""

from pipeline.registry.stores.sqlite.store import SqliteSchemaStore

__all__ = ["SqliteSchemaStore"]
