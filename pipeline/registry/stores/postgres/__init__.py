"""The shared registry store on PostgreSQL, for several registry replicas."""

from pipeline.registry.stores.postgres.store import PostgresSchemaStore

__all__ = ["PostgresSchemaStore"]
