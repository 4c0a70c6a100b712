"""Run an App as a group member until SIGTERM or SIGINT, then shut down gracefully."""

from __future__ import annotations

import asyncio
import importlib
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff

from pipeline.config import Settings
from pipeline.errors import ConfigError
from pipeline.runtime.app import App
from pipeline.runtime.member import Member
from pipeline.transport import create_transport


def load_app(target: str) -> App:
    """Import ``module:attribute`` (the current directory is importable) and return the App."""
    module_name, sep, attribute = target.partition(":")
    if not sep or not module_name or not attribute:
        raise ConfigError(f"expected MODULE:APP, e.g. consumers.messages:app (got {target!r})")
    if str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"cannot import {module_name!r}: {exc}") from exc
    app = getattr(module, attribute, None)
    if not isinstance(app, App):
        raise ConfigError(f"{target!r} is not a pipeline App (got {type(app).__name__})")
    return app


async def serve(
    app: App, settings: Settings, group: str, *, lanes: Sequence[str] | None = None
) -> None:
    """Run one member of ``group``; SIGTERM or SIGINT starts a graceful shutdown."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    transport = create_transport(settings)
    # One quick retry: admission, parking and debouncing fail open when Redis is down, so a
    # call must fail fast rather than hold a message through seconds of client backoff.
    redis = Redis.from_url(
        settings.redis.url,
        socket_timeout=settings.redis.socket_timeout_s,
        socket_connect_timeout=settings.redis.socket_timeout_s,
        retry=Retry(ExponentialBackoff(cap=0.2, base=0.05), 1),
    )
    store = None
    if settings.runtime.mark_processed:
        from pipeline.ingress.service import create_log_store  # noqa: PLC0415 - only when used

        store = create_log_store(settings, settings.ingress)
        await store.open()
    member = Member(
        app,
        transport,
        group,
        settings.runtime,
        lanes=lanes,
        redis=redis,
        redis_prefix=settings.redis.key_prefix,
        processed=store,
    )
    try:
        await member.run(stop)
    finally:
        if store is not None:
            await store.close()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        await transport.close()
        await redis.aclose()
