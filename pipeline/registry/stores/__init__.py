"""Where the registry keeps schemas: one protocol, one package per database (as logstore)."""
