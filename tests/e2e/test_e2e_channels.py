"""Opening and closing channels as on RabbitMQ, with real clients over TCP: channel_max
limits how many channels are open, not their numbers, and a channel the server is
closing waits for the client's close-ok, answering a crossing channel.close. The
protocol itself is checked in-process (test_channel_protocol.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import amqpstorm
import pika
import pytest

from ..support.broker import wait_until

AMQPLIB_VERSION = "2.3.1"
FULL = "NOT_ALLOWED - number of channels opened ({n}) has reached the negotiated channel_max ({n})"


# -- channel_max ---------------------------------------------------------------------

def test_pika_picking_its_own_channel_numbers(broker):
    conn = pika.BlockingConnection(pika.ConnectionParameters(
        "127.0.0.1", broker.port, channel_max=3))
    channels = [conn.channel(number) for number in (3, 7, 9)]
    assert channels[1].queue_declare("", exclusive=True).method.queue
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as info:
        conn.channel(11)
    assert (info.value.reply_code, info.value.reply_text) == (530, FULL.format(n=3))


# -- a channel the server is closing ---------------------------------------------------

def test_amqpstorm_closing_a_channel_the_server_closes(broker):
    conn = amqpstorm.Connection("127.0.0.1", "guest", "guest", port=broker.port, timeout=10)
    for _ in range(3):
        channel = conn.channel()
        channel.basic.ack(99)
        # amqpstorm's close() racing its own reader can mark the channel closed before
        # the reader sends close-ok, and then reuse the number while the server still
        # waits for it (RabbitMQ answers that channel.open with 504 too); so let the
        # reader finish. The crossing close itself is test_channel_protocol's and
        # amqplib's below.
        wait_until(lambda: channel.is_closed, message="server's channel.close")
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
