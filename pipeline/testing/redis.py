"""A Redis in this process for tests: fakeredis running the project's own Lua Functions.

The run guard (parking), throttles, the debouncer and ``ctx.once`` keep their state in Redis
through Lua libraries (``FUNCTION LOAD`` + ``FCALL``). In tests they run unchanged on
`fakeredis <https://github.com/cunla/fakeredis-py>`_ with its Lua engine (lupa): the same
scripts, not a re-implementation of them (``tests/testing/test_redis.py`` runs every library).
Install it with the ``testing`` extra: ``pip install 'pipeline[testing]'``.
"""

from __future__ import annotations

from types import ModuleType

from redis.asyncio import Redis

from pipeline.errors import ConfigError

_fakeredis: ModuleType | None
try:  # imported with pipeline.testing: its import takes a few hundred ms, once per process
    import fakeredis as _fakeredis
except ImportError:  # the `testing` extra is not installed: fake_redis() says so
    _fakeredis = None


def fake_redis() -> Redis:
    """A client of a new, empty in-process Redis 7 server that runs Lua Functions."""
    if _fakeredis is None:
        raise ConfigError(
            "pipeline.testing needs fakeredis with Lua: pip install 'pipeline[testing]'"
        )
    server = _fakeredis.FakeServer(version=(7, 4))
    client: Redis = _fakeredis.FakeAsyncRedis(server=server, version=(7, 4), decode_responses=False)
    return client
