"""A Confluent-compatible schema registry, and Avro events end to end.

The pieces, in the order a schema travels::

    schemas/*.avsc ──▶ canonical (parse, normalise, fingerprint) ──▶ compat (resolution rules)
        ──▶ service (versions, deletes, levels, modes) ──▶ store (SQLite | PostgreSQL)
        ──▶ api (Starlette, Confluent REST) ──▶ client / serde (wire format, fastavro)

* :func:`~pipeline.registry.api.create_app` serves the API over a
  :class:`~pipeline.registry.store.RegistryStore` (:func:`~pipeline.registry.store.open_store`).
* :class:`~pipeline.registry.serde.AvroSerializer` and
  :class:`~pipeline.registry.serde.AvroDeserializer` read and write the Confluent wire format,
  interchangeably with ``confluent_kafka``'s serdes.
* ``pipeline.registry.cli`` holds the ``registry serve`` and ``schemas push/check/ls`` commands.

See ``docs/registry.md``.
"""
