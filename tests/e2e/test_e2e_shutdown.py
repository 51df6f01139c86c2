"""Stopping with clients connected: every client is told 320 CONNECTION_FORCED at
once (RabbitMQ's words), the broker does not wait on clients that do not answer,
stops well under a second, and what was confirmed is there after the restart."""

from __future__ import annotations

import signal
import time

import pika
import pytest

from ..support.broker import RunningBroker
from ..support.rawclient import RawClient

# Well under the ~5 s a stop took while it waited for every client's close-ok.
EXIT_DEADLINE = 3.0
# "Well under a second" (README): it took 0.7-1.0 s with clients that never answer
# the close (half a second of it waiting for their close-ok), 0.3 s now.
STOP_DEADLINE = 0.8


def test_sigterm_with_clients_connected_tells_each_320_and_keeps_confirmed_messages(tmp_path):
    broker = RunningBroker(tmp_path / "data", shards=2).start()
    try:
        publisher = pika.BlockingConnection(pika.URLParameters(broker.url))
        ch = publisher.channel()
        ch.confirm_delivery()
        ch.queue_declare("kept-over-stop", durable=True)
        for i in range(200):  # each confirmed: basic_publish waits for its ack
            ch.basic_publish("", "kept-over-stop", b"m%d" % i,
                             pika.BasicProperties(delivery_mode=2), mandatory=True)
        # Idle clients that will not read before the broker is gone.
        idle = [pika.BlockingConnection(pika.URLParameters(broker.url)) for _ in range(4)]
        for conn in idle:
            conn.channel()

        broker.signal(signal.SIGTERM)
        assert broker.wait(EXIT_DEADLINE) == 0

        for conn in [publisher, *idle]:  # the 320 was sent before the broker went
            with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as closed:
                conn.process_data_events(time_limit=1)
            assert closed.value.reply_code == 320
            assert closed.value.reply_text == ("CONNECTION_FORCED - broker forced connection "
                                               "closure with reason 'shutdown'")
    finally:
        broker.stop()

    again = RunningBroker(tmp_path / "data", shards=2).start()
    try:
        conn = pika.BlockingConnection(pika.URLParameters(again.url))
        ch = conn.channel()
        assert ch.queue_declare("kept-over-stop", passive=True).method.message_count == 200
        bodies = [ch.basic_get("kept-over-stop", auto_ack=True)[2] for _ in range(200)]
        assert bodies == [b"m%d" % i for i in range(200)]
        conn.close()
    finally:
        again.stop()


def stop_seconds(broker: RunningBroker) -> float:
    began = time.monotonic()
    broker.signal(signal.SIGTERM)
    assert broker.wait(EXIT_DEADLINE) == 0
    return time.monotonic() - began


def test_a_broker_with_silent_clients_stops_well_under_a_second(tmp_path):
    # Against the same broker's stop without clients, on the same machine at the same
    # load: a stop that waited for the silent clients' close-ok took half a second more.
    alone = RunningBroker(tmp_path / "alone", shards=2).start()
    try:
        baseline = stop_seconds(alone)
    finally:
        alone.stop()
    broker = RunningBroker(tmp_path / "data", shards=2).start()
    try:
        silent = [RawClient(broker.port) for _ in range(4)]
        for client in silent:  # logged in, then they read and answer nothing
            client.handshake()
            client.open_channel()
        took = stop_seconds(broker)
        assert took < STOP_DEADLINE or took - baseline < STOP_DEADLINE / 2
        for client in silent:  # the 320 reached them all the same
            assert client.next_method(timeout=1)[1].reply_code == 320
    finally:
        broker.stop()
