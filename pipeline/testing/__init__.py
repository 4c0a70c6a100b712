"""Test doubles and a harness for users' own tests: no broker, no Redis server, no waiting.

* :class:`TestApp` runs an App's handlers through the real consumer runtime on in-memory
  services and a :class:`VirtualClock`, and records what ran, retried, dead-lettered and was
  produced (``docs/testing.md``).
* :class:`MemoryTransport` (on a :class:`MemoryBroker`): the Transport protocol in memory,
  held to the same contract suite as Kafka and Redis Streams.
* :func:`fake_redis`: an in-process Redis that runs the project's own Lua Functions.
* :func:`free_port`: a loopback port for a server started later, which no outgoing connection
  can take first.
"""

from pipeline.testing.clock import VirtualClock
from pipeline.testing.harness import TestApp
from pipeline.testing.memory import MemoryBroker, MemoryTransport
from pipeline.testing.ports import free_port
from pipeline.testing.recorder import Run
from pipeline.testing.records import DeadLettered
from pipeline.testing.redis import fake_redis

__all__ = [
    "DeadLettered",
    "MemoryBroker",
    "MemoryTransport",
    "Run",
    "TestApp",
    "VirtualClock",
    "fake_redis",
    "free_port",
]
