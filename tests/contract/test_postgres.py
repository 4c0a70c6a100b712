"""The contract suites against PostgreSQL stores (a real server, a schema per test)."""

from __future__ import annotations

from contract.base.logstore import LogStoreContract
from contract.base.registry_store import RegistryStoreContract


class TestPostgresLogStore(LogStoreContract):
    """PostgresLogStore passes the log store contract."""

    kind = "postgres"


class TestPostgresSchemaStore(RegistryStoreContract):
    """PostgresSchemaStore passes the registry store contract."""

    kind = "postgres"
