"""The PostgreSQL log store: psycopg 3 async pool, group commit, safe with several replicas."""

from pipeline.logstore.postgres.store import PostgresLogStore

__all__ = ["PostgresLogStore"]
