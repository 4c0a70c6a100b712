"""Test doubles and a harness for users' own tests: no broker, no Redis server, no waiting.

* :class:`MemoryTransport` (on a :class:`MemoryBroker`): the Transport protocol in memory,
  held to the same contract suite as Kafka and Redis Streams.
"""

from pipeline.testing.memory import MemoryBroker, MemoryTransport

__all__ = ["MemoryBroker", "MemoryTransport"]
