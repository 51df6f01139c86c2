"""Bad input gets RabbitMQ's reply code and text and closes only what it must, run
in-process (tests/inproc.py); test_e2e_protocol_errors.py keeps the cases a real
client or a real socket shows."""

from __future__ import annotations

import struct

import pytest

from warren.gateway.amqp import frames
from warren.gateway.amqp import methods as m


def test_wrong_protocol_header_gets_ours_back_and_close(inproc):
    client = inproc.client()
    client.send(b"AMQP\x01\x01\x00\x0a")
    assert inproc.run(lambda: client.transport.closed)
    assert bytes(client.transport.written) == b"AMQP\x00\x00\x09\x01"


def test_amqplain_login(inproc):
    client = inproc.client()
    client.send(frames.PROTOCOL_HEADER)
    start = client.expect(0, m.ConnectionStart)
    assert b"AMQPLAIN" in start.mechanisms.split() and b"PLAIN" in start.mechanisms.split()
    client.send_method(0, m.ConnectionStartOk(
        client_properties={}, mechanism="AMQPLAIN",
        response=b"\x05LOGINS\x00\x00\x00\x05guest\x08PASSWORDS\x00\x00\x00\x05guest"))
    tune = client.expect(0, m.ConnectionTune)
    assert (tune.channel_max, tune.frame_max, tune.heartbeat) == (2047, 131072, 60)


def test_bad_amqplain_password_is_403(inproc):
    client = inproc.client()
    client.send(frames.PROTOCOL_HEADER)
    client.expect(0, m.ConnectionStart)
    client.send_method(0, m.ConnectionStartOk(
        client_properties={"capabilities": {"authentication_failure_close": True}},
        mechanism="AMQPLAIN",
        response=b"\x05LOGINS\x00\x00\x00\x05guest\x08PASSWORDS\x00\x00\x00\x03bad"))
    close = client.expect_connection_close(403)
    assert close.reply_text.startswith("ACCESS_REFUSED - Login was refused")


def test_frame_on_unopened_channel_is_504(inproc):
    client = inproc.client()
    client.handshake()
    client.send_method(5, m.QueueDeclare(queue="x"))
    close = client.expect_connection_close(504)
    assert (close.reply_text, close.class_id, close.method_id) == (
        "CHANNEL_ERROR - expected 'channel.open'", 50, 10)


def publish_then(*frames_after) -> list[tuple[int, bytes]]:
    return [(frames.FRAME_METHOD, m.encode_method(m.BasicPublish(exchange="", routing_key="x"))),
            *frames_after]


HEADER = (frames.FRAME_HEADER, struct.pack(">HHQH", 60, 0, 10, 0))
QOS = (frames.FRAME_METHOD, m.encode_method(m.BasicQos(prefetch_count=1)))
CONTENT_HEADER_EXPECTED = ("UNEXPECTED_FRAME - expected content header for class 60, got non "
                           "content header frame instead", 60, 40)
CONTENT_BODY_EXPECTED = ("UNEXPECTED_FRAME - expected content body, got non content body frame "
                         "instead", 60, 40)


@pytest.mark.parametrize("sent, close", [
    (publish_then((frames.FRAME_BODY, b"body first")), CONTENT_HEADER_EXPECTED),
    (publish_then(QOS), CONTENT_HEADER_EXPECTED),
    (publish_then(HEADER, QOS), CONTENT_BODY_EXPECTED),
    (publish_then(HEADER, HEADER), CONTENT_BODY_EXPECTED),
    (publish_then((frames.FRAME_HEADER, struct.pack(">HHQH", 50, 0, 10, 0))),
     ("UNEXPECTED_FRAME - expected content header for class 60, got one for class 50 instead",
      60, 40)),
    ([(frames.FRAME_BODY, b"x")],
     ("UNEXPECTED_FRAME - expected method frame, got non method frame instead", 0, 0)),
], ids=["body-without-header", "method-instead-of-header", "method-instead-of-body",
        "header-instead-of-body", "header-of-another-class", "body-without-publish"])
def test_frames_out_of_turn_are_505_in_rabbitmqs_words(inproc, sent, close):
    client = inproc.client()
    client.handshake()
    client.open_channel(1)
    for frame_type, payload in sent:
        client.send_frame(frame_type, 1, payload)
    got = client.expect_connection_close(505)
    assert (got.reply_text, got.class_id, got.method_id) == close


WHOLE_PUBLISH = publish_then(HEADER, (frames.FRAME_BODY, b"0123456789"))


@pytest.mark.parametrize("together", [True, False], ids=["in-one-read", "frame-by-frame"])
@pytest.mark.parametrize("channel, sent, code, close", [
    (1, publish_then(*WHOLE_PUBLISH), 505, CONTENT_HEADER_EXPECTED),
    (1, publish_then(HEADER, *WHOLE_PUBLISH), 505, CONTENT_BODY_EXPECTED),
    (0, WHOLE_PUBLISH, 504,
     ("CHANNEL_ERROR - unexpected method in connection state running", 60, 40)),
    (2, WHOLE_PUBLISH, 504, ("CHANNEL_ERROR - expected 'channel.open'", 60, 40)),
    # a header's weight must be 0: RabbitMQ takes one that is not for no header
    (1, publish_then((frames.FRAME_HEADER, struct.pack(">HHQH", 60, 1, 10, 0)),
                     (frames.FRAME_BODY, b"0123456789")), 505, CONTENT_HEADER_EXPECTED),
], ids=["inside-a-publish", "inside-a-body", "on-channel-0", "on-an-unopened-channel",
        "header-with-a-weight"])
def test_a_whole_publish_where_none_may_come_is_the_same_error_however_it_is_read(
        inproc, together, channel, sent, code, close):
    """A publish read in one pass (all its frames in the buffer) is refused exactly as
    its frames one by one are."""
    client = inproc.client()
    client.handshake()
    client.open_channel(1)
    data = [struct.pack(">BHI", frame_type, channel, len(payload)) + payload + b"\xce"
            for frame_type, payload in sent]
    for piece in [b"".join(data)] if together else data:
        client.send(piece)
    got = client.expect_connection_close(code)
    assert (got.reply_text, got.class_id, got.method_id) == close


def test_bad_frame_end_is_501(inproc):
    client = inproc.client()
    client.handshake()
    client.send_frame(frames.FRAME_METHOD, 0, m.encode_method(m.ChannelOpen()), end=0x00)
    assert client.expect_connection_close(501).reply_text == (
        "FRAME_ERROR - type 1, all octets = <<0,20,0,10,0>>: {invalid_frame_end_marker,0}")


def test_frame_over_frame_max_is_501(inproc):
    client = inproc.client()
    client.handshake()
    client.open_channel(1)
    client.send_method(1, m.BasicPublish(exchange="", routing_key="x"))
    client.send_frame(frames.FRAME_HEADER, 1, struct.pack(">HHQH", 60, 0, 200_000, 0))
    client.send_frame(frames.FRAME_BODY, 1, b"x" * 200_000)
    assert client.expect_connection_close(501).reply_text == (
        "FRAME_ERROR - type 3, all octets = <<>>: {frame_too_large,200000,131064}")


def test_undecodable_arguments_are_501_as_on_rabbitmq(inproc):
    client = inproc.client()
    client.handshake()
    client.open_channel(1)
    payload = m.encode_method(m.QueueDeclare(queue="x"))[:5]  # cut inside the arguments
    client.send_frame(frames.FRAME_METHOD, 1, payload)
    close = client.expect_connection_close(501)
    assert close.reply_text.startswith("FRAME_ERROR - cannot decode <<0>>")
    assert (close.class_id, close.method_id) == (50, 10)


def next_close(client) -> m.ConnectionClose:
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
], ids=["class-id-only", "empty", "cut-arguments"])
def test_malformed_frame_behind_a_waiting_declare_closes_only_its_sender(inproc, bad_payload,
                                                                         text):
    """Issue 17.1: a method frame too short to decode, sent while its channel waits for
    a shard's answer, used to escape when replayed and stop that shard's events for
    every client. Now it is the sender's 501 at once (RabbitMQ's text), and the shard
    keeps serving everyone."""
    healthy = inproc.client()
    healthy.handshake()
    healthy.open_channel(1)
    healthy.call(1, m.ConfirmSelect(), m.ConfirmSelectOk)
    healthy.call(1, m.QueueDeclare(queue="wedge.q", durable=True), m.QueueDeclareOk)
    healthy.call(1, m.QueuePurge(queue="wedge.q"), m.QueuePurgeOk)
    for n in range(3):
        attacker = inproc.client()
        attacker.handshake()
        attacker.open_channel(1)
        attacker.send(frames.method_frame(1, m.QueueDeclare(queue="wedge.q", durable=True))
                      + struct.pack(">BHI", frames.FRAME_METHOD, 1, len(bad_payload))
                      + bad_payload + b"\xce")
        close = next_close(attacker)
        assert (close.reply_code, close.reply_text) == (501, text)
        attacker.answer_close()
        # The same shard still answers: declare, a confirmed publish, a get.
        declared = healthy.call(1, m.QueueDeclare(queue="wedge.q", durable=True, passive=True),
                                m.QueueDeclareOk)
        assert declared.message_count == 0
        healthy.publish(1, "wedge.q", b"still here")
        assert healthy.expect(1, m.BasicAck).delivery_tag == n + 1
        healthy.call(1, m.BasicGet(queue="wedge.q", no_ack=True), m.BasicGetOk)
        assert healthy.content()[1] == b"still here"
