"""Every Redis key the Redis Streams transport touches, in one place.

Keys of one partition share the hash tag ``{prefix:topic:partition}`` and keys of one consumer
group share ``{prefix:g:group}``, so each multi-key function call stays in one Redis Cluster slot.

=================================  ======  ==================================================
key                                type    holds
=================================  ======  ==================================================
``P:topics``                       hash    topic name -> JSON metadata (partitions, max_len)
``P:topics:deleting``              hash    topic name -> its partitions (``0,1,...``) while
                                           its deletion is under way (its metadata gone)
``{P:T:p}:s``                      stream  the messages of partition p of topic T
``{P:T:p}:n``                      string  the next offset of that partition (INCR)
``{P:g:G}:members``                zset    live member id -> lease expiry (ms)
``{P:g:G}:owners``                 hash    ``T:p`` -> ``member|expiry_ms`` partition leases
``{P:g:G}:pos``                    hash    ``T:p`` -> committed offset; ``T:p:meta`` metadata
=================================  ======  ==================================================
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Keys:
    """Key names under one prefix (``PIPELINE_REDIS__KEY_PREFIX``)."""

    prefix: str = "pl"

    @property
    def topics(self) -> str:
        """The topic metadata hash."""
        return f"{self.prefix}:topics"

    @property
    def deleting(self) -> str:
        """The topics whose deletion is under way: name -> their partitions (``0,1,...``)."""
        return f"{self.prefix}:topics:deleting"

    def stream(self, topic: str, partition: int) -> str:
        """The stream of one partition."""
        return f"{{{self.prefix}:{topic}:{partition}}}:s"

    def sequence(self, topic: str, partition: int) -> str:
        """The offset counter of one partition."""
        return f"{{{self.prefix}:{topic}:{partition}}}:n"

    def members(self, group: str) -> str:
        """The live members of a group."""
        return f"{{{self.prefix}:g:{group}}}:members"

    def owners(self, group: str) -> str:
        """The partition leases of a group."""
        return f"{{{self.prefix}:g:{group}}}:owners"

    def positions(self, group: str) -> str:
        """The committed positions of a group."""
        return f"{{{self.prefix}:g:{group}}}:pos"


def partition_id(topic: str, partition: int) -> str:
    """The field naming a partition inside group hashes."""
    return f"{topic}:{partition}"


def parse_partition_id(value: str) -> tuple[str, int]:
    """Inverse of :func:`partition_id`."""
    topic, _, partition = value.rpartition(":")
    return topic, int(partition)


def entry_id(offset: int) -> str:
    """The stream entry id of an offset (ids must be above ``0-0``, so offset 0 is ``1-0``)."""
    return f"{offset + 1}-0"


def offset_of(entry: str | bytes) -> int:
    """Inverse of :func:`entry_id`."""
    text = entry.decode() if isinstance(entry, bytes) else entry
    return int(text.partition("-")[0]) - 1
