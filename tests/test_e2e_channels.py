"""Opening and closing channels as on RabbitMQ: channel_max limits how many channels
are open, not their numbers, and a channel the server is closing waits for the
client's close-ok, answering a crossing channel.close and dropping other frames."""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
from pathlib import Path

import amqpstorm
import pika
import pytest

from warren.gateway.amqp import frames
from warren.gateway.amqp import methods as m

from .rawclient import RawClient

AMQPLIB_VERSION = "2.3.1"
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


# -- a channel the server is closing ---------------------------------------------------

def test_crossing_channel_close_gets_close_ok_and_the_channel_reopens(broker):
    client = RawClient(broker.port)
    client.handshake()
    client.open_channel(1)
    provoke_406(client, 1)
    # Sent before the client has read our close: dropped, a publish's content included.
    client.send_method(1, m.BasicPublish(exchange="", routing_key="nowhere"))
    client.send_frame(frames.FRAME_HEADER, 1, struct.pack(">HHQH", 60, 0, 5, 0))
    client.send_frame(frames.FRAME_BODY, 1, b"hello")
    client.send_method(1, m.QueueDeclare(queue="", exclusive=True))
    client.send_method(1, m.ChannelClose(reply_code=200, reply_text="bye", class_id=0,
                                         method_id=0))
    assert client.next_method() == (1, CLOSE_406)
    assert client.next_method() == (1, m.ChannelCloseOk())
    client.send_method(1, m.ChannelCloseOk())
    client.open_channel(1)
    declare_works(client, 1)
    client.close()


def test_channel_open_on_a_closing_channel_is_504(broker):
    client = RawClient(broker.port)
    client.handshake()
    client.open_channel(1)
    provoke_406(client, 1)
    assert client.next_method() == (1, CLOSE_406)
    client.send_method(1, m.ChannelOpen())
    expect_connection_close(client, 504, "CHANNEL_ERROR - second 'channel.open' seen", 20, 10)


def test_amqpstorm_closing_a_channel_the_server_closes(broker):
    conn = amqpstorm.Connection("127.0.0.1", "guest", "guest", port=broker.port, timeout=10)
    for _ in range(3):
        channel = conn.channel()
        channel.basic.ack(99)
        channel.close()
        with conn.channel() as other:
            assert other.queue.declare("", exclusive=True)["queue"]
    assert conn.is_open
    conn.close()


# -- Node's amqplib ------------------------------------------------------------------

AMQPLIB_SCRIPT = """
const amqp = require('amqplib');
(async () => {
  const conn = await amqp.connect(process.argv[2]);
  conn.on('error', e => console.log('connection error:', e.message));
  const ch = await conn.createChannel();
  ch.on('error', () => {});
  const {queue} = await ch.assertQueue('', {exclusive: true});
  for (let i = 0; i < 2000; i++) ch.sendToQueue(queue, Buffer.from('message ' + i));
  ch.ack({fields: {deliveryTag: 99}});  // the server closes the channel as ours closes
  await ch.close();
  const ch2 = await conn.createChannel();
  console.log('messages', (await ch2.checkQueue(queue)).messageCount);
  await conn.close();
})().catch(e => { console.log('failed:', e.message); process.exit(1); });
"""


@pytest.fixture(scope="module")
def amqplib_path():
    """node_modules holding amqplib, installed once into a cache outside the repo."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.skip("node and npm are needed for amqplib")
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    prefix = cache / "warren-tests" / f"amqplib-{AMQPLIB_VERSION}"
    modules = prefix / "node_modules"
    if not (modules / "amqplib").is_dir():
        prefix.mkdir(parents=True, exist_ok=True)
        result = subprocess.run(
            ["npm", "install", "--prefix", str(prefix), "--no-audit", "--no-fund",
             f"amqplib@{AMQPLIB_VERSION}"], capture_output=True, text=True, timeout=300)
        if result.returncode != 0:
            pytest.skip(f"npm could not install amqplib: {result.stderr[-500:]}")
    return modules


def test_amqplib_closing_a_channel_the_server_closes(broker, amqplib_path, tmp_path):
    script = tmp_path / "crossing.js"
    script.write_text(AMQPLIB_SCRIPT)
    result = subprocess.run(["node", str(script), broker.url], capture_output=True, text=True,
                            timeout=60, env={**os.environ, "NODE_PATH": str(amqplib_path)})
    assert result.stdout.splitlines() == ["messages 2000"], result.stdout + result.stderr
