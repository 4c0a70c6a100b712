"""How large a body a webhook source may accept when its lanes offload.

Without offload a body rides the broker, so a source's ``max_body_bytes`` must fit the message
size. When every topic the source routes to offloads at or below that size, only the reference
rides the broker and the source's own ``max_body_bytes`` (up to 64 MiB) is the cap.
"""

from __future__ import annotations

from collections.abc import Sequence

from pipeline.ingress.settings import SourceConfig
from pipeline.topics.spec import TopicSpec


def inline_cap_bytes(config: SourceConfig, specs: Sequence[TopicSpec], inline_bytes: int) -> int:
    """The largest body ``config`` may accept, where ``inline_bytes`` is what fits a message."""
    policies = {spec.name: spec.offload for spec in specs}
    topics = [config.topic, *(rule.topic for rule in config.routes)]
    offloading = [policies.get(topic) for topic in topics]
    if all(p is not None and p.above_bytes <= inline_bytes for p in offloading):
        return max(config.max_body_bytes, inline_bytes)
    return inline_bytes
