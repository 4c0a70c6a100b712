"""The contract suites against SQLite stores (a file in tmp_path)."""

from __future__ import annotations

from contract.base.logstore import LogStoreContract
from contract.base.registry_store import RegistryStoreContract


class TestSqliteLogStore(LogStoreContract):
    """SqliteLogStore passes the log store contract."""

    kind = "sqlite"


class TestSqliteSchemaStore(RegistryStoreContract):
    """SqliteSchemaStore passes the registry store contract."""

    kind = "sqlite"
