"""An in-memory broker behind the Transport protocol, for tests (``transport/`` file names)."""

from pipeline.testing.memory.broker import MemoryBroker
from pipeline.testing.memory.transport import MemoryTransport

__all__ = ["MemoryBroker", "MemoryTransport"]
