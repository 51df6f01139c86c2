"""Bad input over TCP, as real clients and sockets see it: RabbitMQ's reply code and
text, closing only what it must, never disturbing the broker or other clients. The
protocol errors themselves are checked in-process (test_protocol_errors.py)."""

from __future__ import annotations

import base64
import json
import random
import re
import socket
import struct
import time
import urllib.request

import pika
import pytest

from warren.gateway.amqp import frames
from warren.gateway.amqp import methods as m
from warren.gateway.amqp.fieldtable import MAX_DEPTH

from ..support.broker import RunningBroker, wait_until
from ..support.rawclient import RawClient

pytestmark = pytest.mark.slow  # started first: the two workers then finish together


def connect(broker) -> pika.BlockingConnection:
    return pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", broker.port))


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
    # RabbitMQ's two lines, each with the line prefix: the connection, then why
    wait_until(lambda: re.search(
        rf"\[warning\] <gateway(-\d+)?> closing AMQP connection \({re.escape(name)}, "
        r"vhost: '/', user: 'guest'\):\n.* \[warning\] <gateway(-\d+)?> client unexpectedly "
        r"closed TCP "
        r"connection\n", broker.log_text()))


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


def deep_start_ok(depth: int) -> bytes:
    """connection.start-ok whose client properties nest tables `depth` deep: the
    issue 56.6 attack (2,000 deep: 14 KB, past the 4096 bytes a handshake frame may
    have), sent by a client that never logs in."""
    table = b"\x00\x00\x00\x00"
    for _ in range(depth - 1):
        table = struct.pack(">I", len(table) + 3) + b"\x01aF" + table
    payload = (m.encode_method(m.ConnectionStartOk(client_properties={}))[:4] + table
               + b"\x05PLAIN" + struct.pack(">I", 12) + b"\0guest\0guest" + b"\x05en_US")
    return (frames.PROTOCOL_HEADER + struct.pack(">BHI", frames.FRAME_METHOD, 0, len(payload))
            + payload + b"\xce")


def test_a_flood_of_deep_client_properties_leaves_the_log_small_and_the_canary_served(broker):
    """Issue 56.6: 998 such connections in 20 s wrote 336 MB of tracebacks (541 each)
    and halved the canary's rate. Now each is a handshake error (RabbitMQ's: hung up
    3 s later without a word), logged ten times a second at most, and a confirming
    canary beside them is served as before."""
    canary = connect(broker)
    ch = canary.channel()
    ch.confirm_delivery()
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.basic_publish("", q, b"warm", mandatory=True)  # the first publish sets up its route
    ch.queue_purge(q)
    logged_before = broker.log_path.stat().st_size
    attack = deep_start_ok(2_000)
    slowest, sent, attackers = 0.0, 0, []
    started = time.monotonic()
    while time.monotonic() - started < 4.0:
        while len(attackers) < (time.monotonic() - started) * 60:  # the 50 a second
            sock = socket.create_connection(("127.0.0.1", broker.port))
            sock.sendall(attack)
            attackers.append(sock)
        began = time.monotonic()
        ch.basic_publish("", q, b"canary %d" % sent, mandatory=True)  # confirmed
        sent += 1
        slowest = max(slowest, time.monotonic() - began)
    assert ch.queue_declare(q, passive=True).method.message_count == sent
    # each was hung up on without a word
    for sock in attackers[:20]:
        sock.settimeout(10)
        assert sock.recv(65536).startswith(b"\x01\x00\x00")  # connection.start only
        assert wait_until(lambda: not sock.recv(65536), 10)
    for sock in attackers:
        sock.close()
    canary.close()
    logged = broker.log_path.read_bytes()[logged_before:].decode(errors="replace")
    assert len(attackers) >= 200 and slowest < 0.5, (len(attackers), slowest)
    assert "Traceback" not in logged and "internal error" not in logged
    # ten a second in each gateway process, over the attack's seconds
    assert logged.count("frame_too_large") <= 10 * broker.gateways * 6
    assert len(logged) < 400 * len(attackers), len(logged)  # was ~340 KB each


def test_arguments_nested_to_the_bound_survive_every_gateway_the_api_and_a_restart(
        tmp_path):
    """Arguments MAX_DEPTH deep pass every step that walks them (the catalogue's
    store and its changes to the other gateways, the management API's JSON, the
    recovery): the bound leaves each its margin (issue 56.6: 300 deep failed)."""
    running = RunningBroker(tmp_path / "data", management=True).start()
    try:
        table = b"\x00\x00\x00\x00"
        for _ in range(MAX_DEPTH - 1):
            table = struct.pack(">I", len(table) + 3) + b"\x01kF" + table
        declare = m.encode_method(m.QueueDeclare(queue="deep.q", durable=True))[:-4] + table
        for gateway in (1, 0, 1):  # the last after a restart
            port = running.gateway_port(1) if gateway and running.gateways > 1 else running.port
            client = RawClient(port)
            client.handshake()
            client.open_channel(1)
            client.send_frame(frames.FRAME_METHOD, 1, declare)  # the second time: equivalent
            client.expect(1, m.QueueDeclareOk)
            client.close()
            with urllib.request.urlopen(urllib.request.Request(
                    running.http_url + "/api/queues", headers={"Authorization": "Basic "
                    + base64.b64encode(b"guest:guest").decode()})) as answer:
                assert [q["name"] for q in json.load(answer)] == ["deep.q"]
            if gateway == 0:
                running.stop()
                running.start()
        assert "Traceback" not in running.log_text()
    finally:
        running.stop()
