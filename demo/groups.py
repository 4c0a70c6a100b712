"""The example consumer groups of ``consumers/``, observed for the demo dashboard.

``pipeline consume demo.groups:messages --group demo-messages`` runs the example
``consumers.messages`` handler unchanged, with each call recorded by :mod:`.observe` in the Redis
the settings name (``PIPELINE_REDIS__URL``, under ``PIPELINE_REDIS__KEY_PREFIX``).
"""

from __future__ import annotations

from redis.asyncio import Redis

from demo.observe import RedisObservations, observe_app
from pipeline.config import load_settings
from pipeline.runtime import App
from pipeline.runtime.run import load_app


def _observed(target: str) -> App:
    settings = load_settings()
    redis = Redis.from_url(settings.redis.url, socket_timeout=settings.redis.socket_timeout_s)
    return observe_app(load_app(target), RedisObservations(redis, settings.redis.key_prefix))


def __getattr__(name: str) -> App:
    """``messages``, ``ai_turns`` or ``engagement``: that example group, observed."""
    if name in {"messages", "ai_turns", "engagement"}:
        app = _observed(f"consumers.{name}:app")
        globals()[name] = app
        return app
    raise AttributeError(name)
