"""Bad input gets RabbitMQ's reply code and text and closes only what it must, run
in-process (tests/support/session.py); test_e2e_protocol_errors.py keeps the cases a real
client or a real socket shows."""

from __future__ import annotations

import logging
import struct

import pytest

from warren.gateway.amqp import frames, spec
from warren.gateway.amqp import methods as m
from warren.gateway.amqp.fieldtable import MAX_DEPTH
from warren.gateway.logthrottle import CLIENT_ERRORS_PER_SECOND
from warren.gateway.session.lifecycle import HANDSHAKE_ERROR_DELAY


def test_wrong_protocol_header_gets_ours_back_and_close(inline):
    client = inline.client()
    client.send(b"AMQP\x01\x01\x00\x0a")
    assert inline.run(lambda: client.wire.closed)
    assert bytes(client.wire.written) == b"AMQP\x00\x00\x09\x01"


def test_amqplain_login(inline):
    client = inline.client()
    client.send(frames.PROTOCOL_HEADER)
    start = client.expect(0, m.ConnectionStart)
    assert b"AMQPLAIN" in start.mechanisms.split() and b"PLAIN" in start.mechanisms.split()
    client.send_method(0, m.ConnectionStartOk(
        client_properties={}, mechanism="AMQPLAIN",
        response=b"\x05LOGINS\x00\x00\x00\x05guest\x08PASSWORDS\x00\x00\x00\x05guest"))
    tune = client.expect(0, m.ConnectionTune)
    assert (tune.channel_max, tune.frame_max, tune.heartbeat) == (2047, 131072, 60)


def test_bad_amqplain_password_is_403(inline):
    client = inline.client()
    client.send(frames.PROTOCOL_HEADER)
    client.expect(0, m.ConnectionStart)
    client.send_method(0, m.ConnectionStartOk(
        client_properties={"capabilities": {"authentication_failure_close": True}},
        mechanism="AMQPLAIN",
        response=b"\x05LOGINS\x00\x00\x00\x05guest\x08PASSWORDS\x00\x00\x00\x03bad"))
    close = client.expect_connection_close(403)
    assert close.reply_text.startswith("ACCESS_REFUSED - Login was refused")


def test_frame_on_unopened_channel_is_504(inline):
    client = inline.client()
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
def test_frames_out_of_turn_are_505_in_rabbitmqs_words(inline, sent, close):
    client = inline.client()
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
        inline, together, channel, sent, code, close):
    """A publish read in one pass (all its frames in the buffer) is refused exactly as
    its frames one by one are."""
    client = inline.client()
    client.handshake()
    client.open_channel(1)
    data = [struct.pack(">BHI", frame_type, channel, len(payload)) + payload + b"\xce"
            for frame_type, payload in sent]
    for piece in [b"".join(data)] if together else data:
        client.send(piece)
    got = client.expect_connection_close(code)
    assert (got.reply_text, got.class_id, got.method_id) == close


def test_bad_frame_end_is_501(inline):
    client = inline.client()
    client.handshake()
    client.send_frame(frames.FRAME_METHOD, 0, m.encode_method(m.ChannelOpen()), end=0x00)
    assert client.expect_connection_close(501).reply_text == (
        "FRAME_ERROR - type 1, all octets = <<0,20,0,10,0>>: {invalid_frame_end_marker,0}")


def test_frame_over_frame_max_is_501(inline):
    client = inline.client()
    client.handshake()
    client.open_channel(1)
    client.send_method(1, m.BasicPublish(exchange="", routing_key="x"))
    client.send_frame(frames.FRAME_HEADER, 1, struct.pack(">HHQH", 60, 0, 200_000, 0))
    client.send_frame(frames.FRAME_BODY, 1, b"x" * 200_000)
    assert client.expect_connection_close(501).reply_text == (
        "FRAME_ERROR - type 3, all octets = <<>>: {frame_too_large,200000,131064}")


def test_undecodable_arguments_are_501_as_on_rabbitmq(inline):
    client = inline.client()
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
def test_malformed_frame_behind_a_waiting_declare_closes_only_its_sender(inline, bad_payload,
                                                                         text):
    """Issue 17.1: a method frame too short to decode, sent while its channel waits for
    a shard's answer, used to escape when replayed and stop that shard's events for
    every client. Now it is the sender's 501 at once (RabbitMQ's text), and the shard
    keeps serving everyone."""
    healthy = inline.client()
    healthy.handshake()
    healthy.open_channel(1)
    healthy.call(1, m.ConfirmSelect(), m.ConfirmSelectOk)
    healthy.call(1, m.QueueDeclare(queue="wedge.q", durable=True), m.QueueDeclareOk)
    healthy.call(1, m.QueuePurge(queue="wedge.q"), m.QueuePurgeOk)
    for n in range(3):
        attacker = inline.client()
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


# --- the handshake and frames, as RabbitMQ 3.10 answers them (issue 56.9) ---------------


def silently_closed(inline, client) -> bool:
    """Whether the broker wrote nothing more and hung up HANDSHAKE_ERROR_DELAY later
    (not before): RabbitMQ's answer to an error before tune-ok."""
    written = len(client.wire.written)
    inline.settle()
    if client.wire.closed:
        return False
    inline.advance(HANDSHAKE_ERROR_DELAY - 0.5)
    if client.wire.closed:
        return False
    inline.advance(0.5)
    return inline.run(lambda: client.wire.closed) \
        and len(client.wire.written) == written


def started(client, client_properties: bytes | None = None) -> None:
    """Protocol header and start-ok (its client properties raw when given)."""
    client.send(frames.PROTOCOL_HEADER)
    client.expect(0, m.ConnectionStart)
    if client_properties is None:
        client.send_method(0, m.ConnectionStartOk(client_properties={}, mechanism="PLAIN",
                                                  response=b"\0guest\0guest", locale="en_US"))
    else:
        ids = m.encode_method(m.ConnectionStartOk(client_properties={}))[:4]
        client.send_frame(frames.FRAME_METHOD, 0, ids + client_properties
                          + b"\x05PLAIN" + struct.pack(">I", 12) + b"\0guest\0guest"
                          + b"\x05en_US")


@pytest.mark.parametrize("frame_max, channel_max, logged", [
    (0, 2047, "negotiated frame_max = 0 is higher than the maximum allowed value (131072)"),
    (4095, 2047, "negotiated frame_max = 4095 is lower than the minimum allowed value (4096)"),
    (131073, 2047, "negotiated frame_max = 131073 is higher than the maximum allowed value "
                   "(131072)"),
    (131072, 0, "negotiated channel_max = 0 (no limit) is higher than the maximum allowed "
                "value (2047)"),
    (131072, 2048, "negotiated channel_max = 2048 is higher than the maximum allowed value "
                   "(2047)"),
])
def test_tune_ok_past_the_offer_is_refused_without_a_word_as_on_rabbitmq(
        inline, caplog, frame_max, channel_max, logged):
    """frame_max=0 ("no limit") was accepted (issue 56.9). RabbitMQ refuses it, and any
    value past its offer, by hanging up 3 s later: no connection.close."""
    client = inline.client()
    started(client)
    client.expect(0, m.ConnectionTune)
    inline.advance(1.0)  # a second of its own for the log throttle
    with caplog.at_level(logging.ERROR, logger="warren.connection"):
        client.send_method(0, m.ConnectionTuneOk(channel_max=channel_max, frame_max=frame_max,
                                                 heartbeat=0))
        client.send_method(0, m.ConnectionOpen(virtual_host="/"))
        assert silently_closed(inline, client)
    assert [r.getMessage().split("\n")[1] for r in caplog.records] == [
        f"failed to negotiate connection parameters: {logged}"]


@pytest.mark.parametrize("payload, text", [
    (b"xyz", 'FRAME_ERROR - type 8, all octets = <<"xyz">>: unknown_frame'),
    (b"a\nb\"c\\", 'FRAME_ERROR - type 8, all octets = <<"a\\nb\\"c\\\\">>: unknown_frame'),
    (bytes(range(40)), "FRAME_ERROR - type 8, first 16 octets = "
                       "<<0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15>>: unknown_frame"),
])
def test_a_heartbeat_with_a_payload_is_501_as_on_rabbitmq(inline, payload, text):
    """It was taken as a heartbeat (issue 56.9)."""
    client = inline.client()
    client.handshake()
    client.send_frame(frames.FRAME_HEARTBEAT, 0, payload)
    close = client.expect_connection_close(501)
    assert (close.reply_text, close.class_id, close.method_id) == (text, 0, 0)


def test_a_heartbeat_on_a_channel_is_505_as_on_rabbitmq(inline):
    client = inline.client()
    client.handshake()
    client.open_channel(1)
    client.send_frame(frames.FRAME_HEARTBEAT, 1, b"")
    close = client.expect_connection_close(505)
    assert close.reply_text == "UNEXPECTED_FRAME - type 8, all octets = <<>>"


def test_frames_before_open_ok_and_wrong_connection_methods_in_rabbitmqs_words(inline):
    client = inline.client()
    started(client)
    tune = client.expect(0, m.ConnectionTune)
    client.send_method(0, m.ConnectionTuneOk(channel_max=tune.channel_max,
                                             frame_max=tune.frame_max, heartbeat=0))
    client.send_method(1, m.ChannelOpen())
    close = client.expect_connection_close(505)
    assert close.reply_text == "UNEXPECTED_FRAME - type 1, all octets = <<0,20,0,10,0>>"
    client = inline.client()
    started(client)
    client.expect(0, m.ConnectionTune)
    client.send_method(0, m.ConnectionTuneOk(channel_max=2047, frame_max=131072, heartbeat=0))
    client.send_method(0, m.ConnectionStartOk(client_properties={}, mechanism="PLAIN",
                                              response=b"\0guest\0guest", locale="en_US"))
    close = client.expect_connection_close(504)
    assert (close.reply_text, close.class_id, close.method_id) == (
        "CHANNEL_ERROR - unexpected method in connection state opening", 10, 11)


@pytest.mark.parametrize("sent", [
    frames.method_frame(0, m.ConnectionOpen(virtual_host="/")),  # before start-ok
    struct.pack(">BHI", frames.FRAME_HEARTBEAT, 0, 2) + b"ab\xce",
    struct.pack(">BHI", frames.FRAME_METHOD, 0, 5000) + bytes(5000) + b"\xce",  # > 4096
], ids=["open-before-start-ok", "heartbeat-payload", "frame-over-4096"])
def test_errors_before_start_ok_close_without_a_word_as_on_rabbitmq(inline, sent):
    """Before tune-ok RabbitMQ trusts no client: it hangs up 3 s after an error and
    says nothing, and frames are 4096 bytes at most (a 14 KB start-ok nested 2,000
    deep was read whole, issue 56.6)."""
    client = inline.client()
    client.send(frames.PROTOCOL_HEADER)
    client.expect(0, m.ConnectionStart)
    client.send(sent)
    assert silently_closed(inline, client)


def nested_properties(depth: int) -> bytes:
    """Client properties holding tables `depth` deep in all (themselves included),
    with empty keys: 6 bytes a level, the most that fit a 4096-byte frame."""
    table = b"\x00\x00\x00\x00"
    for _ in range(depth - 1):
        table = struct.pack(">I", len(table) + 2) + b"\x00F" + table
    return table


def test_client_properties_nested_past_the_bound_are_one_line_in_the_log(inline, caplog):
    """Issue 56.6: start-ok with client properties 2,000 deep was a 541 and a 3,000-line
    traceback. Now as deep as fits a handshake frame is accepted up to the bound,
    and past it the handshake ends as for any undecodable start-ok: one line."""
    client = inline.client()
    started(client, nested_properties(MAX_DEPTH))
    client.expect(0, m.ConnectionTune)
    assert len(nested_properties(MAX_DEPTH + 1)) < spec.FRAME_MIN_SIZE - 100
    client = inline.client()
    inline.advance(1.0)  # a second of its own for the log throttle
    with caplog.at_level(logging.ERROR, logger="warren.connection"):
        started(client, nested_properties(MAX_DEPTH + 1))
        assert silently_closed(inline, client)
    [record] = caplog.records
    assert not record.exc_info
    assert record.getMessage().split("\n")[1].startswith(
        '{handshake_error,starting,0,{amqp_error,frame_error,"cannot decode <<')


def declare_frame(queue: str, arguments: bytes) -> bytes:
    """queue.declare with raw arguments (a field table with its length)."""
    return (m.encode_method(m.QueueDeclare(queue=queue))[:-4] + arguments)


def nested_table(depth: int, leaf: bytes = b"") -> bytes:
    """A table `depth` deep in all, each level the one entry 'k' of the one above."""
    table = struct.pack(">I", len(leaf)) + leaf
    for _ in range(depth - 1):
        table = struct.pack(">I", len(table) + 3) + b"\x01kF" + table
    return table


def test_arguments_and_headers_nest_to_the_bound_and_past_it_are_refused(inline):
    """Issue 56.6: declare arguments 300 deep and headers 450 deep were 541s with
    tracebacks (RabbitMQ takes 500 and more). Up to MAX_DEPTH they are served; past it
    they are what any undecodable table is: 501 for arguments, 502 for properties."""
    client = inline.client()
    client.handshake()
    client.open_channel(1)
    client.send_frame(frames.FRAME_METHOD, 1, declare_frame("deep.q", nested_table(MAX_DEPTH)))
    client.expect(1, m.QueueDeclareOk)
    client.call(1, m.ConfirmSelect(), m.ConfirmSelectOk)
    headers = nested_table(MAX_DEPTH)
    properties = struct.pack(">H", 0x2000) + headers
    client.publish(1, "deep.q", b"deep", properties=properties)
    client.expect(1, m.BasicAck)
    client.call(1, m.BasicGet(queue="deep.q", no_ack=True), m.BasicGetOk)
    assert client.content() == (properties, b"deep")
    client.publish(1, "deep.q", b"deeper", properties=struct.pack(">H", 0x2000)
                   + nested_table(MAX_DEPTH + 1))
    close = client.expect_connection_close(502)
    assert close.reply_text == ("SYNTAX_ERROR - malformed content properties: bad table "
                                f"property: field tables and arrays nested deeper than "
                                f"{MAX_DEPTH} levels")
    client = inline.client()
    client.handshake()
    client.open_channel(1)
    client.send_frame(frames.FRAME_METHOD, 1, declare_frame("deeper.q",
                                                            nested_table(MAX_DEPTH + 1)))
    close = client.expect_connection_close(501)
    assert close.reply_text.startswith("FRAME_ERROR - cannot decode <<")
    assert (close.class_id, close.method_id) == (50, 10)


@pytest.mark.parametrize("value", [
    b"L" + struct.pack(">q", -1),
    b"T" + struct.pack(">Q", 1_764_355_200_000),  # milliseconds sent as seconds
    b"T" + struct.pack(">Q", 2**64 - 1),
], ids=["L", "T-milliseconds", "T-max"])
def test_l_and_t_past_year_9999_are_taken_as_on_rabbitmq(inline, value):
    """Issue 56.9: 'L' was refused and a 'T' past year 9999 closed the connection
    with 502; RabbitMQ takes both, in arguments and in headers, and the headers go
    out as they came."""
    client = inline.client()
    client.handshake()
    client.open_channel(1)
    entry = b"\x01v" + value
    client.send_frame(frames.FRAME_METHOD, 1, declare_frame(
        "typed.q", struct.pack(">I", len(entry)) + entry))
    client.expect(1, m.QueueDeclareOk)
    client.call(1, m.QueueBind(queue="typed.q", exchange="amq.headers",
                               arguments={"x-match": "any", "v": 1}), m.QueueBindOk)
    properties = struct.pack(">HI", 0x2000, len(entry)) + entry
    client.publish(1, "", b"typed", exchange="amq.headers", properties=properties)
    client.publish(1, "typed.q", b"typed", properties=properties)
    client.call(1, m.BasicGet(queue="typed.q", no_ack=True), m.BasicGetOk)
    assert client.content() == (properties, b"typed")
    client.call(1, m.QueueDelete(queue="typed.q"), m.QueueDeleteOk)


def test_a_flood_of_one_client_error_is_logged_ten_times_a_second_and_counted(inline, caplog):
    """Issue 56.6: 998 bad connections in 20 s wrote 336 MB of log. Each kind of
    client error is logged CLIENT_ERRORS_PER_SECOND times a second; the rest are
    counted in one line when the second ends."""
    clients = []
    for _ in range(CLIENT_ERRORS_PER_SECOND + 25):
        client = inline.client()
        client.send(frames.PROTOCOL_HEADER)
        client.expect(0, m.ConnectionStart)
        clients.append(client)
    inline.advance(1.0)  # a second of its own for the log throttle
    with caplog.at_level(logging.ERROR, logger="warren.connection"):
        for client in clients:  # connection.open before start-ok: a handshake error
            client.send(frames.method_frame(0, m.ConnectionOpen(virtual_host="/")))
        inline.settle()
        errors = [r.getMessage() for r in caplog.records]
        assert len(errors) == CLIENT_ERRORS_PER_SECOND
        inline.advance(1.0)
        inline.run(lambda: all(client.wire.closed for client in clients))
        assert [r.getMessage() for r in caplog.records][CLIENT_ERRORS_PER_SECOND:] == [
            "25 more client errors of this kind not logged in the last second (handshake "
            f"error): more than {CLIENT_ERRORS_PER_SECOND} a second"]
