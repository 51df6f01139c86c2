"""Bad input gets RabbitMQ's reply code and text, closes only what it must, and never
disturbs the broker or other clients."""

from __future__ import annotations

import random
import socket
import struct
import time

import pika
import pytest

from warren.gateway.amqp import frames
from warren.gateway.amqp import methods as m

from .conftest import wait_until
from .rawclient import RawClient


def connect(broker) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", broker.port))


def expect_connection_close(client: RawClient, code: int, text_start: str) -> m.ConnectionClose:
    channel, method = client.next_method()
    assert channel == 0 and isinstance(method, m.ConnectionClose), method
    assert method.reply_code == code, method
    assert method.reply_text.startswith(text_start), method.reply_text
    client.send_method(0, m.ConnectionCloseOk())
    assert client.next_frame() is None  # and the server hangs up
    return method


def test_wrong_protocol_header_gets_ours_back_and_close(broker):
    sock = socket.create_connection(("127.0.0.1", broker.port), timeout=5)
    sock.sendall(b"AMQP\x01\x01\x00\x0a")
    data = b""
    while True:
        chunk = sock.recv(100)
        if not chunk:
            break
        data += chunk
    assert data == b"AMQP\x00\x00\x09\x01"
    sock.close()


def test_missing_queue_is_404_and_closes_only_the_channel(broker):
    conn = connect(broker)
    ch = conn.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        ch.queue_declare("does-not-exist", passive=True)
    assert info.value.reply_code == 404
    assert info.value.reply_text == "NOT_FOUND - no queue 'does-not-exist' in vhost '/'"
    ch2 = conn.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as info:
        ch2.basic_publish("no-such-exchange", "k", b"x")
        ch2.queue_declare("", exclusive=True)  # the close arrives while we wait here
    assert info.value.reply_code == 404
    assert info.value.reply_text == "NOT_FOUND - no exchange 'no-such-exchange' in vhost '/'"
    assert conn.channel().queue_declare("", exclusive=True).method.queue  # connection lives
    conn.close()


def test_bad_credentials_are_403(broker):
    with pytest.raises(pika.exceptions.ProbableAuthenticationError) as info:
        pika.BlockingConnection(pika.ConnectionParameters(
            "127.0.0.1", broker.port, credentials=pika.PlainCredentials("guest", "wrong")))
    assert "ACCESS_REFUSED" in str(info.value)
    client = RawClient(broker.port)
    client.send(frames.PROTOCOL_HEADER)
    client.next_method()
    client.send_method(0, m.ConnectionStartOk(
        client_properties={"capabilities": {"authentication_failure_close": True}},
        mechanism="AMQPLAIN", response=b"\x05LOGINS\x00\x00\x00\x05guest\x08PASSWORDS\x00\x00\x00\x03bad"))
    expect_connection_close(client, 403, "ACCESS_REFUSED - Login was refused")


def test_amqplain_login(broker):
    client = RawClient(broker.port)
    client.send(frames.PROTOCOL_HEADER)
    _, start = client.next_method()
    assert b"AMQPLAIN" in start.mechanisms.split() and b"PLAIN" in start.mechanisms.split()
    client.send_method(0, m.ConnectionStartOk(
        client_properties={}, mechanism="AMQPLAIN",
        response=b"\x05LOGINS\x00\x00\x00\x05guest\x08PASSWORDS\x00\x00\x00\x05guest"))
    _, tune = client.next_method()
    assert isinstance(tune, m.ConnectionTune)
    assert (tune.channel_max, tune.frame_max, tune.heartbeat) == (2047, 131072, 60)
    client.close()


def test_frame_on_unopened_channel_is_504(broker):
    client = RawClient(broker.port)
    client.handshake()
    client.send_method(5, m.QueueDeclare(queue="x"))
    expect_connection_close(client, 504, "CHANNEL_ERROR")


def test_content_body_without_header_is_505(broker):
    client = RawClient(broker.port)
    client.handshake()
    client.open_channel(1)
    client.send_method(1, m.BasicPublish(exchange="", routing_key="x"))
    client.send_frame(frames.FRAME_BODY, 1, b"body first")
    expect_connection_close(client, 505, "UNEXPECTED_FRAME")


def test_method_instead_of_content_header_is_505(broker):
    client = RawClient(broker.port)
    client.handshake()
    client.open_channel(1)
    client.send_method(1, m.BasicPublish(exchange="", routing_key="x"))
    client.send_method(1, m.BasicQos(prefetch_count=1))
    expect_connection_close(client, 505, "UNEXPECTED_FRAME")


def test_bad_frame_end_is_501(broker):
    client = RawClient(broker.port)
    client.handshake()
    client.send_frame(frames.FRAME_METHOD, 0, m.encode_method(m.ChannelOpen()), end=0x00)
    expect_connection_close(client, 501, "FRAME_ERROR")


def test_frame_over_frame_max_is_501(broker):
    client = RawClient(broker.port)
    client.handshake()
    client.open_channel(1)
    client.send_method(1, m.BasicPublish(exchange="", routing_key="x"))
    client.send_frame(frames.FRAME_HEADER, 1, struct.pack(">HHQH", 60, 0, 200_000, 0))
    client.send_frame(frames.FRAME_BODY, 1, b"x" * 200_000)
    expect_connection_close(client, 501, "FRAME_ERROR")


def test_undecodable_arguments_are_501_as_on_rabbitmq(broker):
    client = RawClient(broker.port)
    client.handshake()
    client.open_channel(1)
    payload = m.encode_method(m.QueueDeclare(queue="x"))[:5]  # cut inside the arguments
    client.send_frame(frames.FRAME_METHOD, 1, payload)
    close = expect_connection_close(client, 501, "FRAME_ERROR - cannot decode <<0>>")
    assert (close.class_id, close.method_id) == (50, 10)


def next_close(client: RawClient) -> m.ConnectionClose:
    """The connection.close, past the declare-ok RabbitMQ may still send before it."""
    while True:
        channel, method = client.next_method()
        if not isinstance(method, m.QueueDeclareOk):
            assert channel == 0 and isinstance(method, m.ConnectionClose), method
            return method


@pytest.mark.parametrize("bad_payload, text", [
    (b"\x00\x32", "FRAME_ERROR - type 1, all octets = <<0,50>>: unknown_frame"),
    (b"", "FRAME_ERROR - type 1, all octets = <<>>: unknown_frame"),
    (b"\x00\x32\x00\x0a\x00", "FRAME_ERROR - cannot decode <<0>>"),
])
def test_malformed_frame_behind_a_waiting_declare_closes_only_its_sender(broker, bad_payload,
                                                                         text):
    """Issue 17.1: a method frame too short to decode, sent while its channel waits for
    a shard's answer, used to escape when replayed and stop that shard's events for
    every client. Now it is the sender's 501 at once (RabbitMQ's text), and the shard
    keeps serving everyone."""
    healthy = connect(broker)
    ch = healthy.channel()
    ch.confirm_delivery()
    ch.queue_declare("wedge.q", durable=True)
    ch.queue_purge("wedge.q")
    for _ in range(3):
        attacker = RawClient(broker.port)
        attacker.handshake()
        attacker.open_channel(1)
        attacker.send(frames.method_frame(1, m.QueueDeclare(queue="wedge.q", durable=True))
                      + struct.pack(">BHI", frames.FRAME_METHOD, 1, len(bad_payload))
                      + bad_payload + b"\xce")
        close = next_close(attacker)
        assert (close.reply_code, close.reply_text) == (501, text)
        attacker.send_method(0, m.ConnectionCloseOk())
        assert attacker.next_frame() is None
        # The same shard still answers: declare, a confirmed publish, a get.
        assert ch.queue_declare("wedge.q", durable=True, passive=True).method.message_count == 0
        ch.basic_publish("", "wedge.q", b"still here")
        method, _, body = ch.basic_get("wedge.q", auto_ack=True)
        assert body == b"still here"
    healthy.close()


def test_heartbeats_sent_and_missing_ones_detected(broker):
    client = RawClient(broker.port)
    client.handshake(heartbeat=1)
    started = time.monotonic()
    saw_heartbeat = False
    while True:
        frame = client.next_frame(timeout=10)
        if frame is None:
            break
        saw_heartbeat |= frame[0] == frames.FRAME_HEARTBEAT
    # We never sent one back: the broker hangs up after two intervals (plus one tick).
    assert saw_heartbeat
    assert 1.5 < time.monotonic() - started < 6


def test_fuzzed_frames_never_hurt_other_clients(broker):
    rng = random.Random(1234)
    conn = connect(broker)
    ch = conn.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    valid = [m.encode_method(x) for x in (
        m.ChannelOpen(), m.QueueDeclare(queue="fuzz"), m.BasicPublish(routing_key="fuzz"),
        m.BasicConsume(queue="fuzz"), m.BasicAck(delivery_tag=7), m.ExchangeDeclare(
            exchange="fz", type="direct"), m.ChannelClose(reply_code=200))]
    for attempt in range(60):
        try:
            client = RawClient(broker.port, timeout=2)
            if attempt % 3:
                client.handshake()
            chunks = []
            for _ in range(rng.randint(1, 8)):
                kind = rng.random()
                if kind < 0.3:
                    chunks.append(bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 64))))
                else:
                    payload = rng.choice(valid)
                    if kind < 0.6:
                        payload = payload[:rng.randint(0, len(payload))]
                    frame = struct.pack(">BHI", rng.choice([1, 2, 3, 8, 9]), rng.randint(0, 3),
                                        len(payload)) + payload + b"\xce"
                    if kind > 0.9:
                        frame = frame[:rng.randint(1, len(frame))]
                    chunks.append(frame)
            client.send(b"".join(chunks))
            client.sock.settimeout(0.2)
            try:
                while client.sock.recv(65536):
                    pass
            except (socket.timeout, ConnectionError):
                pass
            client.close()
        except (ConnectionError, socket.timeout, AssertionError):
            pass
        # The well-behaved client on its own connection still works.
        ch.basic_publish("", q, str(attempt).encode())
        method, _, body = ch.basic_get(q, auto_ack=True)
        assert body == str(attempt).encode()
    conn.close()


def test_channel_flow_pauses_and_resumes_deliveries(broker):
    from warren.gateway.amqp import frames as f

    client = RawClient(broker.port)
    client.handshake()
    client.open_channel(1)
    client.send_method(1, m.QueueDeclare(queue="", exclusive=True))
    _, ok = client.next_method()
    client.send_method(1, m.ChannelFlow(active=False))
    assert client.next_method() == (1, m.ChannelFlowOk(active=False))
    client.send_method(1, m.BasicConsume(queue=ok.queue, no_ack=True))
    assert isinstance(client.next_method()[1], m.BasicConsumeOk)
    publish = m.encode_method(m.BasicPublish(routing_key=ok.queue))
    client.send(f.content_frames(1, publish, 60, b"\x00\x00", b"held", 131072))
    with pytest.raises(socket.timeout):
        client.next_method(timeout=0.3)  # flow is off: nothing is delivered
    client.send_method(1, m.ChannelFlow(active=True))
    assert client.next_method() == (1, m.ChannelFlowOk(active=True))
    _, deliver = client.next_method()
    assert isinstance(deliver, m.BasicDeliver) and deliver.delivery_tag == 1
    client.close()


def test_amqpstorm_bodies_cut_at_frame_max_go_through(broker):
    """Issue 16.3: RabbitMQ accepts a body frame whose payload is frame_max bytes,
    and amqpstorm cuts large bodies exactly there."""
    import amqpstorm

    body = bytes(range(256)) * 1200  # 307,200 bytes: several frames of frame_max
    with amqpstorm.Connection("127.0.0.1", "guest", "guest", port=broker.port) as conn:
        with conn.channel() as ch:
            ch.queue.declare("storm.big", auto_delete=False)
            ch.queue.purge("storm.big")
            amqpstorm.Message.create(ch, body).publish("storm.big")
            message = wait_until(lambda: ch.basic.get("storm.big", no_ack=True))
            assert message.body == body
            ch.queue.delete("storm.big")


def test_an_abrupt_disconnect_is_logged_as_rabbitmq_logs_it(broker):
    """Issue 14's fanout4 loss left no line on the broker: a peer that hangs up
    without connection.close is now named in the log."""
    client = RawClient(broker.port)
    client.handshake()
    name = "127.0.0.1:%d -> 127.0.0.1:%d" % (client.sock.getsockname()[1], broker.port)
    client.close()
    wait_until(lambda: f"closing AMQP connection {name} (vhost '/', user 'guest'): client "
               "unexpectedly closed TCP connection" in broker.log_text())


def test_frames_after_the_clients_close_are_dropped_and_the_close_stays_clean(broker):
    """The Go client's TestConcurrentClose sends connection.close from 32 goroutines;
    amqplib closes behind 2,000 unsent publishes. Warren answered the first close
    and hung up with the rest unread, so the client got a reset (EPIPE, 'connection
    reset by peer'). As RabbitMQ does, it now drops what follows close-ok and ends
    the connection cleanly once the client closes its side."""
    client = RawClient(broker.port)
    client.handshake()
    client.open_channel(1)
    close = frames.method_frame(0, m.ConnectionClose(reply_code=200, reply_text="bye"))
    publish = frames.content_frames(1, m.encode_method(m.BasicPublish(routing_key="nowhere")),
                                    60, b"\x00\x00", b"x" * 1000, 131072)
    client.send(close * 32 + publish * 200)
    assert client.next_method() == (0, m.ConnectionCloseOk())
    client.sock.shutdown(socket.SHUT_WR)
    client.sock.settimeout(10)
    assert client.sock.recv(100) == b""  # a clean end: no second close-ok, no reset
    client.close()


def test_queue_delete_ok_comes_before_the_consumers_cancel(broker):
    """kombu deletes a queue from its consumer's own channel and reads delete-ok;
    RabbitMQ sends queue.delete-ok first, basic.cancel after."""
    client = RawClient(broker.port)
    client.handshake(capabilities={"consumer_cancel_notify": True})
    client.open_channel(1)
    client.send_method(1, m.QueueDeclare(queue="delete-order"))
    client.next_method()
    client.send_method(1, m.BasicConsume(queue="delete-order", consumer_tag="c1"))
    assert isinstance(client.next_method()[1], m.BasicConsumeOk)
    client.send_method(1, m.QueueDelete(queue="delete-order"))
    assert [type(client.next_method()[1]) for _ in range(2)] == [m.QueueDeleteOk, m.BasicCancel]
    client.close()
