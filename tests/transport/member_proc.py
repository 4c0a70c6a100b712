"""A named group member in its own process, so tests can kill -9 it.

Usage: python member_proc.py TRANSPORT GROUP TOPIC INSTANCE PARTITIONS [stop]
Joins GROUP as INSTANCE with the test settings (PIPELINE_* from the environment apply), polls
until it owns PARTITIONS partitions, prints "owned" and the partitions as one line, then keeps
polling (and heartbeating) until it is killed. With ``stop`` it polls no more once it owns them
(a member stuck in its work: its client still heartbeats, but serves no rebalance).
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from support import test_settings

from pipeline.transport import create_transport


async def main(
    transport_name: str, group: str, topic: str, instance: str, count: int, then: str = "poll"
) -> None:
    """Run the member until killed."""
    base = test_settings()
    membership = base.membership.model_copy(update={"instance": instance})
    kafka = base.kafka
    if "PIPELINE_KAFKA__SESSION_TIMEOUT_MS" in os.environ:  # test_settings fixes its own
        session_ms = int(os.environ["PIPELINE_KAFKA__SESSION_TIMEOUT_MS"])
        kafka = kafka.model_copy(update={"session_timeout_ms": session_ms})
    redis = base.redis
    if "PIPELINE_REDIS__LEASE_MS" in os.environ:
        redis = redis.model_copy(update={"lease_ms": int(os.environ["PIPELINE_REDIS__LEASE_MS"])})
    configured = base.model_copy(update={"membership": membership, "kafka": kafka, "redis": redis})
    transport = create_transport(configured, transport_name)
    consumer = transport.consumer(group, [topic])
    announced = False
    while True:
        await consumer.poll(100, 0.2)
        if not announced and len(consumer.assignment()) == count:
            owned = sorted(tp.partition for tp in consumer.assignment())
            sys.stdout.write("owned " + ",".join(map(str, owned)) + "\n")
            sys.stdout.flush()
            announced = True
            if then == "stop":
                await asyncio.Event().wait()  # until killed


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:5], int(sys.argv[5]), *sys.argv[6:7]))
