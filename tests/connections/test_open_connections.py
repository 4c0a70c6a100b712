"""OpenConnections keeps the bound's rule itself: which connection is evictable, and the count.

Both HTTP layers (the ingress's and the metrics ports') tell it what happens to a connection
(admitted, active, answering, answered, lost) and it alone edits its stalled order and each
connection's ``admitted`` mark. Before, each protocol edited the stalled order itself and had
to clear its own "counted" flag when evicted: one that forgot left the count twice (evicted,
then lost), and the bound then held one more connection for each such eviction. The fake
connection here clears nothing, as a careless third protocol would.
"""

from __future__ import annotations

import logging

import pytest

from pipeline.observability.connections import LIMIT_LOG_EVERY_S, OpenConnections


class _Connection:
    """A client connection as a protocol holds it; eviction only records that it happened."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.admitted = False
        self.evictions = 0

    def evict(self) -> None:
        self.evictions += 1

    def __repr__(self) -> str:
        return self.name


def _bound(limit: int) -> tuple[OpenConnections[_Connection], list[str]]:
    outcomes: list[str] = []
    return OpenConnections[_Connection](limit, counted=outcomes.append), outcomes


def _admitted(connections: OpenConnections[_Connection], *names: str) -> list[_Connection]:
    held = [_Connection(name) for name in names]
    for connection in held:
        assert connections.admit(connection)
    return held


def test_an_evicted_connection_then_lost_leaves_the_count_once() -> None:
    """Evicted, a connection no longer counts: its loss after that does not free a place."""
    connections, outcomes = _bound(2)
    a, b = _admitted(connections, "a", "b")

    (c,) = _admitted(connections, "c")  # past the bound: a, stalled the longest, is evicted
    assert (a.evictions, a.admitted, c.admitted) == (1, False, True)
    connections.leave(a)  # its transport's close comes back as the connection lost
    assert connections.count == 2

    (d,) = _admitted(connections, "d")  # still at the bound: b is evicted for it
    assert (b.evictions, b.admitted) == (1, False)
    connections.leave(b)
    assert connections.count == 2
    assert outcomes == ["closed", "closed"]
    assert list(connections.stalled) == [c, d]


def test_a_connection_answering_is_not_evicted_and_once_answered_is_the_last() -> None:
    """Answering, a connection is passed over; answered, it is evicted after the others."""
    connections, outcomes = _bound(2)
    a, b = _admitted(connections, "a", "b")

    connections.answering(a)
    (c,) = _admitted(connections, "c")  # a is answering: b, though newer, is evicted
    assert (a.evictions, b.evictions) == (0, 1)

    connections.answered(a)  # answered after c came: the last to evict
    assert list(connections.stalled) == [c, a]
    (d,) = _admitted(connections, "d")
    assert c.evictions == 1

    connections.answering(a)
    connections.answering(d)
    e = _Connection("e")
    assert not connections.admit(e)  # every one answering: the new one is refused
    assert not e.admitted
    connections.leave(e)  # a refused connection never counted
    assert connections.count == 2
    assert outcomes == ["closed", "closed", "refused"]


def test_a_connection_lost_while_answering_is_not_put_back() -> None:
    """A connection lost before its answer is not made evictable again once answered."""
    connections, _ = _bound(1)
    (a,) = _admitted(connections, "a")
    connections.answering(a)
    connections.leave(a)  # the client went away; its request is still answered
    connections.answered(a)
    assert not a.admitted
    assert (connections.count, list(connections.stalled)) == (0, [])

    b, c = _Connection("b"), _Connection("c")
    assert connections.admit(b)
    assert connections.admit(c)  # b is evicted, never a, which is gone
    assert (a.evictions, b.evictions, connections.count) == (0, 1, 1)


def test_connections_closed_for_the_bound_are_logged_at_most_every_few_seconds(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """One line for the connections closed since the last, at most every LIMIT_LOG_EVERY_S."""
    now = [100.0]
    log = logging.getLogger("tests.open_connections")
    connections = OpenConnections[_Connection](
        1, bound="the test bound", log=log, clock=lambda: now[0]
    )
    with caplog.at_level(logging.WARNING, logger=log.name):
        _admitted(connections, "a", "b")  # a evicted: one line
        now[0] += LIMIT_LOG_EVERY_S / 2
        _admitted(connections, "c")  # b evicted: not logged yet
        now[0] += LIMIT_LOG_EVERY_S
        _admitted(connections, "d")  # c evicted: the line counts b and c
    lines = [record.getMessage() for record in caplog.records]
    assert len(lines) == 2
    assert "the test bound: 1 stalled ones closed" in lines[0]
    assert "the test bound: 2 stalled ones closed" in lines[1]


def test_a_connection_that_only_closes_is_evicted_first() -> None:
    """A refused connection read until its client closes goes before the ones stalled longer.

    The ingress reads a refused client on for a few seconds (a lingering close); those are the
    connections with nothing more to ask, so a new connection takes the place of one of them,
    the oldest first (the newest is the likeliest to be still sending what it was refused
    for), not of a client whose request may still come. Such an eviction is not counted as a
    stalled one's. A lost one is not evicted.
    """
    connections, outcomes = _bound(4)
    a, b, c, d = _admitted(connections, "a", "b", "c", "d")
    connections.answering(c)
    connections.done(c)  # refused while answered, now only closing
    connections.done(d)  # refused after c
    _admitted(connections, "e")
    assert [x.evictions for x in (a, b, c, d)] == [0, 0, 1, 0]
    _admitted(connections, "f")
    assert [x.evictions for x in (a, b, c, d)] == [0, 0, 1, 1]
    assert outcomes == []
    connections.leave(b)
    connections.done(b)  # lost before: nothing to evict, nothing counted
    assert connections.count == 3
    assert b not in connections.closing
    _admitted(connections, "g")  # a free place: nothing evicted
    _admitted(connections, "h")  # at the bound again: a, the stalled one, goes
    assert (a.evictions, outcomes) == (1, ["closed"])
