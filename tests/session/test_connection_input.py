"""How a connection takes its input, in-process (tests/support/session.py, which
reads input into the connection's buffer as uvloop does): the read buffer's memory,
and how much of it one loop turn handles."""

from __future__ import annotations

import struct

from warren.gateway.amqp import frames
from warren.gateway.amqp import methods as m
from warren.gateway.session.connection import FRAMES_PER_SHARED_TURN, FRAMES_PER_TURN
from warren.gateway.session.lifecycle import OPEN


def test_an_idle_connection_gives_its_read_buffer_back(inline):
    """Thousands of idle connections must not hold a read buffer each: at its
    heartbeat tick, a connection with nothing unread lets its buffer go."""
    client = inline.client()
    client.handshake(heartbeat=2)
    client.open_channel()
    reader = client.conn.reader
    assert len(reader.get_buffer(0)) >= frames.READ_SIZE  # held after reading
    inline.advance(1.1)  # a tick (every heartbeat / 2): nothing was read since
    assert len(reader._buffer) == 0
    # Reading goes on as before.
    client.call(1, m.QueueDeclare(queue="", exclusive=True), m.QueueDeclareOk)
    assert client.conn.state == OPEN  # the tick was not taken for missed heartbeats



def test_heartbeats_are_judged_by_what_the_socket_read_and_wrote(inline):
    """As RabbitMQ's heartbeat monitor: the broker sends a heartbeat when it wrote
    nothing for half an interval, and closes the connection after two intervals
    (four ticks) in which it read nothing; any frame read starts the count again."""
    client = inline.client()
    client.handshake(heartbeat=2)
    client.open_channel()
    heartbeat = struct.pack(">BHI", frames.FRAME_HEARTBEAT, 0, 0) + b"\xce"
    written = len(client.wire.written)
    inline.advance(1.0)  # a tick after the handshake's writes: no heartbeat yet
    assert len(client.wire.written) == written
    inline.advance(1.0)  # half an interval with nothing written
    assert bytes(client.wire.written[written:]) == heartbeat
    for _ in range(2):  # three quiet ticks in a row so far...
        inline.advance(1.0)
    client.send(heartbeat)  # ...and the client's heartbeat starts the count again
    for _ in range(4):  # the tick that sees it read, then three quiet ones
        inline.advance(1.0)
    assert client.conn.state == OPEN and not client.wire.aborted
    inline.advance(1.0)  # the fourth quiet tick in a row: two missed intervals
    assert client.wire.aborted

def test_a_flood_yields_sooner_while_acks_come_in(inline):
    """A publisher with input to spare handles FRAMES_PER_TURN frames a loop turn
    beside another flood, and FRAMES_PER_SHARED_TURN once another connection
    handled anything but publishes (a consumer's acks, say; heartbeats here) since
    its last; and that one, FRAMES_PER_SHARED_TURN too while publishes come in.
    Each ack frees a delivery, and behind a flood it waits for the turns of both."""
    publisher, flood, other = inline.client(), inline.client(), inline.client()
    for client in (publisher, flood, other):
        client.handshake()
        client.open_channel()
    queue = publisher.call(1, m.QueueDeclare(queue="", exclusive=True), m.QueueDeclareOk).queue
    one = frames.content_frames(1, m.encode_method(m.BasicPublish(routing_key=queue)), 60,
                                b"\x00\x00", b"x", 131072)
    count = 100  # within the connection's credit: nothing but the budget holds it
    reader = publisher.conn.reader

    def handled() -> int:
        return count - reader.buffered // len(one)

    heartbeat = struct.pack(">BHI", frames.FRAME_HEARTBEAT, 0, 0) + b"\xce"

    publisher.conn.receive(one * count)  # its first turn, here
    flood.conn.receive(one * count)  # another flood's, to the same queue
    before = handled()
    inline.clock.step()  # one loop turn: each flood's next share
    beside_a_flood = handled() - before
    other.conn.receive(heartbeat)
    before = handled()
    inline.clock.step()
    after_other_input = handled() - before
    other.conn.receive(heartbeat * 200)  # and publishes came in since its last turn
    assert (beside_a_flood, after_other_input, 200 - other.conn.reader.buffered // 8) == (
        FRAMES_PER_TURN // 3, FRAMES_PER_SHARED_TURN // 3, FRAMES_PER_SHARED_TURN)
    inline.run(lambda: reader.buffered == flood.conn.reader.buffered == 0)  # the rest later
    assert publisher.call(1, m.QueueDeclare(queue=queue, passive=True),
                          m.QueueDeclareOk).message_count == 2 * count


def test_a_released_connection_handles_what_it_read_before_reading_again(inline):
    """A publisher held by credit is released after every shard turn of a flood.
    Reading its socket at each release took in another buffer's worth while a
    turn handles a slice, and the input it held grew without bound (17 MB in an
    amqp-perf flood): it reads again only once what it read is handled."""
    client = inline.client()
    client.handshake()
    client.open_channel()
    queue = client.call(1, m.QueueDeclare(queue="", exclusive=True), m.QueueDeclareOk).queue
    conn = client.conn
    cause = object()  # any hold: a shard link out of credit, say
    conn.hold(cause)
    method = m.encode_method(m.BasicPublish(routing_key=queue))
    client.send(frames.content_frames(1, method, 60, b"\x00\x00", b"x", 131072) * 200)
    assert conn.reader.buffered > 0  # read while held, not handled
    conn.release(cause)
    assert client.wire.paused  # 600 frames wait: no more reading meanwhile
    assert inline.run(lambda: conn.reader.buffered == 0)
    assert not client.wire.paused  # all handled: reading again
    declared = client.call(1, m.QueueDeclare(queue=queue, passive=True), m.QueueDeclareOk)
    assert declared.message_count == 200
