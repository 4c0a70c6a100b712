"""The example consumer groups of ``consumers/``, observed for the demo dashboard.

``pipeline consume demo.groups:messages --group demo-messages`` runs the example
``consumers.messages`` handler unchanged, with each call recorded by :mod:`.observe` in the Redis
the settings name (``PIPELINE_REDIS__URL``, under ``PIPELINE_REDIS__KEY_PREFIX``).
"""

from __future__ import annotations

from pathlib import Path

from redis.asyncio import Redis

from demo.observe import RedisObservations, observe_app
from pipeline.config import load_settings
from pipeline.runtime import App
from pipeline.runtime.run import load_app


def _declared(app: App, topics_dir: Path) -> App:
    """``app``'s handlers on the lanes as ``topics_dir`` declares them.

    The demo runs with its own copy of ``topics/`` when its messages lane offloads
    (:mod:`demo.offload`); the example consumers read ``topics/`` itself.
    """
    out = App(topics_dir, retryable=app.retryable)
    for name, lane in app.lanes.items():
        out.handler(name, cpu=lane.cpu_ref is not None, time_limit_s=lane.time_limit_s)(
            lane.handler
        )
    return out


def _observed(target: str) -> App:
    settings = load_settings()
    redis = Redis.from_url(settings.redis.url, socket_timeout=settings.redis.socket_timeout_s)
    app = _declared(load_app(target), settings.topics_dir)
    return observe_app(app, RedisObservations(redis, settings.redis.key_prefix))


def __getattr__(name: str) -> App:
    """``messages``, ``ai_turns`` or ``engagement``: that example group, observed."""
    if name in {"messages", "ai_turns", "engagement"}:
        app = _observed(f"consumers.{name}:app")
        globals()[name] = app
        return app
    raise AttributeError(name)
