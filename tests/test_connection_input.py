"""How a connection takes its input, in-process (tests/inproc.py, which reads input
into the connection's buffer as uvloop does): the read buffer's memory."""

from __future__ import annotations

from warren.gateway.amqp import frames
from warren.gateway.amqp import methods as m
from warren.gateway.connection import OPEN


def test_an_idle_connection_gives_its_read_buffer_back(inproc):
    """Thousands of idle connections must not hold a read buffer each: at its
    heartbeat tick, a connection with nothing unread lets its buffer go."""
    client = inproc.client()
    client.handshake(heartbeat=2)
    client.open_channel()
    reader = client.conn.reader
    assert len(reader.get_buffer(0)) >= frames.READ_SIZE  # held after reading
    inproc.advance(1.1)  # a tick (every heartbeat / 2): nothing was read since
    assert len(reader._buffer) == 0
    # Reading goes on as before.
    client.call(1, m.QueueDeclare(queue="", exclusive=True), m.QueueDeclareOk)
    assert client.conn.state == OPEN  # the tick was not taken for missed heartbeats
