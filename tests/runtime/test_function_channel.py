"""The function channel answers every FCALL as redis-py would, and fails as it would.

``pipeline consume`` sends its Lua calls (guard, throttle, cancel gate) through a
:class:`~pipeline.redis_channel.FunctionChannel` bound to its Redis client: one pipelined
connection, replies matched to calls in order. These tests hold it to redis-py's behaviour on a
real Redis: replies and error replies, many calls at once, a cancelled call, a library Redis
lost, a server that stops answering or drops the connection, no server at all, a password and a
database, and the clients it must leave to redis-py.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
from collections.abc import AsyncIterator

import pytest
from redis import exceptions as rexc
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from pipeline.redis_channel import FunctionChannel, channel_of, open_channel
from pipeline.redis_functions import FunctionLibrary
from pipeline.testing import free_port


def _source(unique: str) -> str:
    return f"""#!lua name=pl_chan_{unique}
redis.register_function('echo', function(keys, args) return args[1] end)
redis.register_function('shapes', function(keys, args)
  return {{1, 'two', {{3, false}}, redis.status_reply('FINE')}}
end)
redis.register_function('nothing', function(keys, args) return false end)
redis.register_function('count', function(keys, args) return redis.call('INCR', keys[1]) end)
redis.register_function('boom', function(keys, args)
  return redis.error_reply('BOOM ' .. args[1])
end)
redis.register_function('spin', function(keys, args)
  local t = redis.call('TIME')
  local until_us = t[1] * 1000000 + t[2] + tonumber(args[1]) * 1000
  repeat t = redis.call('TIME') until t[1] * 1000000 + t[2] >= until_us
  return 'spun'
end)
"""


@pytest.fixture
async def lib(redis_service: str, unique: str) -> AsyncIterator[FunctionLibrary]:
    """A library on a client with a channel bound to it; unloaded and closed afterwards."""
    client = Redis.from_url(
        redis_service,
        socket_timeout=5,
        socket_connect_timeout=5,
        client_name=f"pl_chan_{unique}",
        retry=Retry(NoBackoff(), 1),
    )
    channel = open_channel(client)
    assert channel is not None
    library = FunctionLibrary(client, _source(unique))
    try:
        yield library
    finally:
        await channel.aclose()
        await client.delete(f"pl_chan_{unique}:n")
        with contextlib.suppress(rexc.ResponseError):  # a test that made no call loaded none
            await client.function_delete(f"pl_chan_{unique}_{library.version}")
        await client.aclose()


async def test_replies_are_the_ones_redis_py_gives(lib: FunctionLibrary, redis: Redis) -> None:
    """Strings, integers, nested arrays, nil and status replies come back as redis-py's do."""
    for name, args in (("echo", ["héllo"]), ("shapes", []), ("nothing", []), ("echo", [42])):
        through_channel = await lib.fcall(name, [], args)
        through_redis_py = await redis.fcall(lib.name(name), 0, *args)
        assert through_channel == through_redis_py
    assert await lib.fcall("shapes", [], []) == [1, b"two", [3, None], b"FINE"]


async def test_concurrent_calls_each_get_their_own_reply(lib: FunctionLibrary, unique: str) -> None:
    """Two hundred calls in flight at once on the one connection, each answered in turn."""
    replies = await asyncio.gather(*(lib.fcall("echo", [], [f"call-{i}"]) for i in range(200)))
    assert replies == [f"call-{i}".encode() for i in range(200)]
    counts = await asyncio.gather(
        *(lib.fcall("count", [f"pl_chan_{unique}:n"], []) for _ in range(50))
    )
    assert sorted(counts) == list(range(1, 51))


async def test_an_error_reply_raises_what_redis_py_raises(
    lib: FunctionLibrary, redis: Redis
) -> None:
    """An error reply is redis-py's ResponseError with the same text, and the channel goes on."""
    with pytest.raises(rexc.ResponseError) as through_channel:
        await lib.fcall("boom", [], ["here"])
    with pytest.raises(rexc.ResponseError) as through_redis_py:
        await redis.fcall(lib.name("boom"), 0, "here")
    assert type(through_channel.value) is type(through_redis_py.value)
    assert str(through_channel.value) == str(through_redis_py.value) == "BOOM here"
    assert await lib.fcall("echo", [], ["after"]) == b"after"


async def test_a_library_redis_lost_is_loaded_again(
    lib: FunctionLibrary, redis: Redis, unique: str
) -> None:
    """FUNCTION DELETE behind the channel's back: the next call reloads it and is answered."""
    assert await lib.fcall("echo", [], ["before"]) == b"before"
    await redis.function_delete(f"pl_chan_{unique}_{lib.version}")
    assert await lib.fcall("echo", [], ["again"]) == b"again"


async def test_a_cancelled_call_leaves_later_replies_in_order(lib: FunctionLibrary) -> None:
    """A caller cancelled while its call runs in Redis: its reply is dropped, not handed on."""
    assert await lib.fcall("echo", [], ["loaded"]) == b"loaded"  # loaded and connected
    slow = asyncio.ensure_future(lib.fcall("spin", [], [50]))
    await asyncio.sleep(0)  # the call is written
    await asyncio.sleep(0)
    slow.cancel()
    with pytest.raises(asyncio.CancelledError):
        await slow
    assert await lib.fcall("echo", [], ["next"]) == b"next"


async def test_a_redis_that_stops_answering_times_the_call_out(
    redis_service: str, redis: Redis, unique: str
) -> None:
    """A paused server: the call fails with TimeoutError, and the next one connects again."""
    client = Redis.from_url(redis_service, socket_timeout=0.2, socket_connect_timeout=2)
    channel = open_channel(client)
    assert channel is not None
    library = FunctionLibrary(client, _source(unique))
    try:
        assert await library.fcall("echo", [], ["up"]) == b"up"
        await redis.execute_command("CLIENT", "PAUSE", 1500, "ALL")
        with pytest.raises(rexc.TimeoutError, match=r"did not answer within 0\.2 s"):
            await library.fcall("echo", [], ["paused"])
        await redis.ping()  # returns once the pause is over
        assert await library.fcall("echo", [], ["back"]) == b"back"
    finally:
        await channel.aclose()
        await client.function_delete(f"pl_chan_{unique}_{library.version}")
        await client.aclose()


async def test_a_dropped_connection_is_opened_again(
    lib: FunctionLibrary, redis: Redis, unique: str
) -> None:
    """CLIENT KILL of the channel's connection: the client's retry policy connects again."""
    assert await lib.fcall("echo", [], ["first"]) == b"first"
    before = await _channel_ids(redis, f"pl_chan_{unique}", lib)
    for client_id in before:
        await redis.execute_command("CLIENT", "KILL", "ID", client_id)
    assert await lib.fcall("echo", [], ["second"]) == b"second"
    after = await _channel_ids(redis, f"pl_chan_{unique}", lib)
    assert after
    assert not set(after) & set(before)


async def _channel_ids(redis: Redis, name: str, lib: FunctionLibrary) -> list[int]:
    """The ids of connections named ``name`` whose last command was an FCALL of ``lib``."""
    listed = await redis.client_list()
    return [
        int(c["id"])
        for c in listed
        if c.get("name") == name and c.get("cmd", "").startswith("fcall")
    ]


async def test_no_server_is_one_clear_connection_error() -> None:
    """Nothing listening: ConnectionError naming the address, raised at once."""
    port = free_port()
    channel = FunctionChannel("127.0.0.1", port, connect_timeout_s=2)
    try:
        with pytest.raises(
            rexc.ConnectionError, match=f"cannot connect to Redis at 127.0.0.1:{port}"
        ):
            await channel.fcall("anything", [], [])
    finally:
        await channel.aclose()


async def test_a_password_and_a_database_are_used(
    redis: Redis, redis_service: str, unique: str
) -> None:
    """A client with a user, a password and database 2: its channel logs in and selects it."""
    user, password = f"pl_chan_{unique}", f"pw-{unique}"
    await redis.execute_command("ACL", "SETUSER", user, "on", f">{password}", "~*", "+@all")
    host_port = redis_service.split("//", 1)[1].split("/", 1)[0]
    client = Redis.from_url(f"redis://{user}:{password}@{host_port}/2", socket_timeout=5)
    channel = open_channel(client)
    assert channel is not None
    library = FunctionLibrary(client, _source(unique))
    key = f"pl_chan_{unique}:n"
    try:
        assert await library.fcall("count", [key], []) == 1
        assert await client.get(key) == b"1"  # redis-py's connection, database 2
        assert await redis.exists(key) == 0  # not in database 0
    finally:
        await channel.aclose()
        await client.delete(key)
        await client.function_delete(f"pl_chan_{unique}_{library.version}")
        await client.aclose()
        await redis.execute_command("ACL", "DELUSER", user)


async def test_a_wrong_password_fails_the_call_not_the_process(redis_service: str) -> None:
    """A refused login is redis-py's authentication error, on the call that needed it."""
    host_port = redis_service.split("//", 1)[1].split("/", 1)[0]
    client = Redis.from_url(f"redis://nobody-here:wrong@{host_port}/0", socket_timeout=5)
    channel = open_channel(client)
    assert channel is not None
    try:
        with pytest.raises(rexc.RedisError):
            await channel.fcall("anything", [], [])
    finally:
        await channel.aclose()
        await client.aclose()


def test_clients_it_cannot_speak_for_keep_redis_py() -> None:
    """TLS, a Unix socket and RESP3 stay on redis-py's own connections."""
    for url, kwargs in (
        ("rediss://127.0.0.1:6379/0", {}),
        ("unix:///tmp/redis-none.sock", {}),
        ("redis://127.0.0.1:6379/0", {"protocol": 3}),
    ):
        client = Redis.from_url(url, **kwargs)
        assert open_channel(client) is None, url
        assert channel_of(client) is None


async def test_a_client_keeps_its_one_channel(lib: FunctionLibrary) -> None:
    """Opening a channel for a client that has one gives that one, not a second connection."""
    bound = channel_of(lib.client)
    assert bound is not None
    assert open_channel(lib.client) is bound


async def test_closing_fails_waiting_calls_and_unbinds(lib: FunctionLibrary) -> None:
    """A call in flight when the channel closes fails; the calls after it go through redis-py."""
    channel = channel_of(lib.client)
    assert channel is not None
    assert await lib.fcall("echo", [], ["loaded"]) == b"loaded"  # loaded and connected
    slow = asyncio.ensure_future(lib.fcall("spin", [], [100]))
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    await channel.aclose()
    with pytest.raises(rexc.ConnectionError):
        await slow
    assert channel_of(lib.client) is None
    assert await lib.fcall("echo", [], ["redis-py"]) == b"redis-py"


async def test_arguments_redis_py_refuses_are_refused(lib: FunctionLibrary) -> None:
    """A bool or None argument is a DataError, as redis-py's encoder says, before any write."""
    for bad in (True, None):
        with pytest.raises(rexc.DataError):
            await lib.fcall("echo", [], [bad])
    assert await lib.fcall("echo", [], [1.5]) == b"1.5"


async def test_many_calls_in_one_write_answer_in_order_with_errors_in_place(
    lib: FunctionLibrary, redis: Redis
) -> None:
    """``fcall_many`` (the producer's batches): replies in order, an error reply in its place.

    The same calls through a redis-py pipeline with ``raise_on_error=False`` give the same list.
    """
    await lib.ensure_loaded()
    channel = channel_of(lib.client)
    assert channel is not None
    calls = [([], ["one"]), ([], [2]), ([], ["three"])]
    replies = await channel.fcall_many(lib.name("echo"), calls)
    assert replies == [b"one", b"2", b"three"]
    mixed = await channel.fcall_many(lib.name("boom"), [([], ["a"]), ([], ["b"])])
    pipe = redis.pipeline(transaction=False)
    for name, args in (("boom", ["a"]), ("boom", ["b"])):
        pipe.fcall(lib.name(name), 0, *args)
    expected = await pipe.execute(raise_on_error=False)
    assert [(type(r), str(r)) for r in mixed] == [(type(r), str(r)) for r in expected]
    assert [str(r) for r in mixed] == ["BOOM a", "BOOM b"]
    assert await channel.fcall_many(lib.name("echo"), []) == []


def test_the_channel_runs_on_uvloop(redis_service: str, unique: str) -> None:
    """The ingress serves on uvloop, whose transports are not asyncio's classes."""
    import uvloop  # noqa: PLC0415 - only this test needs it

    async def main() -> list[bytes]:
        client = Redis.from_url(redis_service, socket_timeout=5)
        channel = open_channel(client)
        assert channel is not None
        library = FunctionLibrary(client, _source(unique))
        try:
            return [await library.fcall("echo", [], ["on uvloop"])]
        finally:
            await channel.aclose()
            await client.function_delete(f"pl_chan_{unique}_{library.version}")
            await client.aclose()

    assert uvloop.run(main()) == [b"on uvloop"]


class _CountingTransport:
    """The wire's transport, counting its writes (every other call goes to the real one)."""

    def __init__(self, transport: asyncio.Transport) -> None:
        self.inner = transport
        self.writes = 0

    def write(self, data: bytes) -> None:
        self.writes += 1
        self.inner.write(data)

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)


async def test_the_calls_of_one_loop_turn_leave_in_one_write(lib: FunctionLibrary) -> None:
    """Calls started in one turn of the loop go out together, each still with its own reply.

    A call started after that turn's write goes in a write of its own.
    """
    assert await lib.fcall("echo", [], ["connect"]) == b"connect"
    channel = channel_of(lib.client)
    assert channel is not None
    wire = channel._wire  # the connection the calls go out on
    assert wire is not None
    assert wire.transport is not None
    counting = _CountingTransport(wire.transport)
    wire.transport = counting  # type: ignore[assignment]
    calls = [asyncio.ensure_future(lib.fcall("echo", [], [i])) for i in range(50)]
    assert await asyncio.gather(*calls) == [str(i).encode() for i in range(50)]
    assert counting.writes == 1
    assert await lib.fcall("echo", [], ["next"]) == b"next"
    assert counting.writes == 2


async def test_a_batch_that_times_out_leaves_no_failure_unretrieved(
    redis_service: str, unique: str
) -> None:
    """A timed-out ``fcall_many`` raises once; its other calls' failures are not logged as lost."""
    client = Redis.from_url(redis_service, socket_timeout=0.1, socket_connect_timeout=2)
    channel = open_channel(client)
    assert channel is not None
    library = FunctionLibrary(client, _source(unique))
    unhandled: list[dict[str, object]] = []
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(lambda _loop, context: unhandled.append(context))
    try:
        await library.ensure_loaded()
        calls = [([], ["300"]), ([], ["1"]), ([], ["1"])]
        with pytest.raises(rexc.TimeoutError):
            await channel.fcall_many(library.name("spin"), calls)
        await asyncio.sleep(0)  # let the callbacks the failure scheduled run
        gc.collect()  # a future whose exception nobody retrieved says so when collected
        assert [c.get("message") for c in unhandled] == []
    finally:
        loop.set_exception_handler(None)
        await channel.aclose()
        await client.aclose()
        async with Redis.from_url(redis_service, socket_timeout=5) as cleanup:
            await cleanup.function_delete(f"pl_chan_{unique}_{library.version}")
