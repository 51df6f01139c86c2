"""Opening channels as on RabbitMQ: channel_max limits how many channels are open,
not their numbers."""

from __future__ import annotations

import struct

import pika
import pytest

from gateway import frames
from gateway import methods as m

from .rawclient import RawClient

FULL = "NOT_ALLOWED - number of channels opened ({n}) has reached the negotiated channel_max ({n})"


def expect_connection_close(client: RawClient, code: int, text: str, class_id: int = 0,
                            method_id: int = 0) -> None:
    channel, method = client.next_method()
    assert (channel, type(method)) == (0, m.ConnectionClose), method
    assert (method.reply_code, method.reply_text, method.class_id, method.method_id) == (
        code, text, class_id, method_id)
    client.send_method(0, m.ConnectionCloseOk())
    assert client.next_frame() is None


def declare_works(client: RawClient, channel: int) -> None:
    client.send_method(channel, m.QueueDeclare(queue="", exclusive=True))
    number, ok = client.next_method()
    assert (number, type(ok)) == (channel, m.QueueDeclareOk), ok


def provoke_406(client: RawClient, channel: int) -> None:
    """Make the server close `channel`: an ack of a tag never delivered."""
    client.send_method(channel, m.BasicAck(delivery_tag=99))


CLOSE_406 = m.ChannelClose(reply_code=406, reply_text="PRECONDITION_FAILED - unknown delivery tag 99",
                           class_id=60, method_id=80)


# -- channel_max ---------------------------------------------------------------------

def test_channel_max_counts_open_channels_whatever_their_numbers(broker):
    client = RawClient(broker.port)
    client.handshake(channel_max=3)
    for number in (3, 7, 9):
        client.open_channel(number)
    declare_works(client, 7)
    client.send_method(11, m.ChannelOpen())
    expect_connection_close(client, 530, FULL.format(n=3))


def test_a_first_channel_may_have_a_number_over_channel_max(broker):
    client = RawClient(broker.port)
    client.handshake(channel_max=3)
    client.open_channel(10)
    declare_works(client, 10)
    client.close()


def test_a_closed_channel_frees_its_place_and_a_closing_one_does_not(broker):
    client = RawClient(broker.port)
    client.handshake(channel_max=2)
    client.open_channel(1)
    client.open_channel(2)
    client.send_method(2, m.ChannelClose(reply_code=200, reply_text="", class_id=0, method_id=0))
    assert client.next_method() == (2, m.ChannelCloseOk())
    client.open_channel(5)
    provoke_406(client, 5)
    assert client.next_method() == (5, CLOSE_406)
    client.send_method(6, m.ChannelOpen())  # 5 still counts until its close-ok
    expect_connection_close(client, 530, FULL.format(n=2))


def test_a_full_connection_refuses_any_frame_on_a_new_channel(broker):
    client = RawClient(broker.port)
    client.handshake(channel_max=1)
    client.open_channel(1)
    client.send_method(2, m.QueueDeclare(queue="x"))
    expect_connection_close(client, 530, FULL.format(n=1))


@pytest.mark.parametrize("frame_type, payload, code, text, class_id, method_id", [
    (frames.FRAME_METHOD, m.encode_method(m.QueueDeclare(queue="x")), 504,
     "CHANNEL_ERROR - expected 'channel.open'", 50, 10),
    (frames.FRAME_METHOD, m.encode_method(m.ChannelCloseOk()), 504,
     "CHANNEL_ERROR - expected 'channel.open'", 20, 41),
    (frames.FRAME_HEADER, struct.pack(">HHQH", 60, 0, 5, 0), 505,
     "UNEXPECTED_FRAME - expected method frame, got non method frame instead", 0, 0),
    (frames.FRAME_BODY, b"hello", 505,
     "UNEXPECTED_FRAME - expected method frame, got non method frame instead", 0, 0),
], ids=["queue.declare", "channel.close-ok", "content header", "content body"])
def test_a_new_channel_must_start_with_channel_open(broker, frame_type, payload, code, text,
                                                    class_id, method_id):
    client = RawClient(broker.port)
    client.handshake()
    client.send_frame(frame_type, 2, payload)
    expect_connection_close(client, code, text, class_id, method_id)


def test_pika_picking_its_own_channel_numbers(broker):
    conn = pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", broker.port, channel_max=3))
    channels = [conn.channel(number) for number in (3, 7, 9)]
    assert channels[1].queue_declare("", exclusive=True).method.queue
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as info:
        conn.channel(11)
    assert (info.value.reply_code, info.value.reply_text) == (530, FULL.format(n=3))
