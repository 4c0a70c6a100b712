"""A Confluent-compatible schema registry, and Avro events end to end.

The pieces, in the order a schema travels::

    schemas/*.avsc ──▶ canonical (parse, normalise, fingerprint) ──▶ compat (resolution rules)
        ──▶ server.service (versions, deletes, levels, modes) ──▶ stores (SQLite | PostgreSQL)
        ──▶ server.api (Starlette, Confluent REST) ──▶ client (HTTP, wire format, fastavro serdes)

Three subpackages: ``server`` (service, api, auth, cache, the uvicorn runner), ``client``
(http, wire, serde, events) and ``stores`` (``protocol`` and one package per database with the
same file names, ``sqlite/store.py`` and ``postgres/store.py``, as ``pipeline.logstore``).

* :func:`~pipeline.registry.server.api.create_app` serves the API over a
  :class:`~pipeline.registry.stores.protocol.RegistryStore`
  (:func:`~pipeline.registry.stores.protocol.open_store`).
* :class:`~pipeline.registry.client.serde.AvroSerializer` and
  :class:`~pipeline.registry.client.serde.AvroDeserializer` read and write the Confluent wire
  format, interchangeably with ``confluent_kafka``'s serdes.
* ``pipeline.registry.cli`` holds the ``registry serve`` and ``schemas push/check/ls`` commands.

See ``docs/registry.md``.
"""
