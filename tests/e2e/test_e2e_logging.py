"""The operator log, read as an operator reads it: RabbitMQ's lines for a
connection's life and its errors, --log-level, --log-file with rotation, and
--log-format json; the shard processes write through the same configuration."""

from __future__ import annotations

import json
import re

import pika
import pytest

from warren.gateway.amqp import methods as m

from ..support.broker import RunningBroker, wait_until
from ..support.rawclient import RawClient


def connect(broker: RunningBroker, name: str | None = None) -> pika.BlockingConnection:
    params = pika.URLParameters(broker.url)
    if name:
        params.client_properties = {"connection_name": name}
    return pika.BlockingConnection(params)


def local_name(conn: pika.BlockingConnection, broker: RunningBroker) -> str:
    """The connection's name in the broker's log: 'peer -> local', as RabbitMQ's."""
    port = conn._impl._transport._sock.getsockname()[1]
    return f"127.0.0.1:{port} -> 127.0.0.1:{broker.port}"


def lines_with(text: str, needle: str) -> list[str]:
    return [line for line in text.splitlines() if needle in line]


def test_a_connections_life_and_its_channel_error_read_as_rabbitmqs(broker):
    conn = connect(broker, "orders-app")
    name = local_name(conn, broker)
    ch = conn.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
        ch.queue_declare("no-such-queue-for-the-log", passive=True)
    assert closed.value.reply_code == 404
    conn.close()

    full = f"{name} - orders-app"
    prefix = r"\S+ \S+ \[(\w+)\] <gateway(?:-\d+)?> "
    expected = [
        ("info", f"accepting AMQP connection ({name})"),
        ("info", f"connection ({name}) has a client-provided name: orders-app"),
        ("info", f"connection ({full}): user 'guest' authenticated and granted access to "
                 f"vhost '/'"),
        ("error", f"Channel error on connection ({full}, vhost: '/', user: 'guest'), "
                  f"channel 1:"),
        ("error", "operation queue.declare caused a channel exception not_found: "
                  "no queue 'no-such-queue-for-the-log' in vhost '/'"),
        ("info", f"closing AMQP connection ({full}, vhost: '/', user: 'guest')"),
    ]

    def logged():
        found = []
        for line in broker.log_text().splitlines():
            match = re.match(prefix + "(.*)$", line)
            if match and (match[1], match[2]) in expected:
                found.append((match[1], match[2]))
        return found if found == expected else None

    wait_until(logged, message=f"log:\n{broker.log_text()[-3000:]}")


def test_a_connection_error_names_the_operation_and_the_exception(broker):
    client = RawClient(broker.port)
    client.handshake()
    name = f"127.0.0.1:{client.sock.getsockname()[1]} -> 127.0.0.1:{broker.port}"
    client.send_method(0, m.ChannelOpen())  # channel.open on channel 0: a hard error
    _, close = client.next_method()
    assert close.reply_code == 504
    client.send_method(0, m.ConnectionCloseOk())
    client.close()
    wait_until(lambda: re.search(
        rf"\[error\] <gateway(-\d+)?> Error on AMQP connection \({re.escape(name)}, "
        r"vhost: '/', user: 'guest', state: running\):\n.* \[error\] <gateway(-\d+)?>  "
        r"operation channel\.open "
        r"caused a connection exception channel_error: \"unexpected method in connection "
        r"state running\"\n", broker.log_text()))


def test_log_level_warning_hides_the_info_lines(tmp_path):
    broker = RunningBroker(tmp_path / "data", shards=1,
                           extra_args=["--log-level", "warning"]).start()
    try:
        connect(broker).close()
        client = RawClient(broker.port)
        client.handshake()
        client.close()  # abrupt: a warning, logged after the first client's info lines
        wait_until(lambda: "client unexpectedly closed TCP connection" in broker.log_text())
        text = broker.log_text()
        assert "accepting AMQP connection" not in text
        assert "authenticated and granted access" not in text
        assert "[info]" not in text  # the shards' start-up lines too
    finally:
        broker.stop()


def test_log_file_rotates_by_size_and_holds_the_shards_lines(tmp_path):
    path = tmp_path / "logs" / "warren.log"
    path.parent.mkdir()
    broker = RunningBroker(tmp_path / "data", shards=2, extra_args=[
        "--log-file", str(path), "--log-file-rotation-size", "4000",
        "--log-file-rotation-count", "2"]).start()
    try:
        def rotated():
            connect(broker).close()
            return (path.parent / "warren.log.2").exists()

        wait_until(rotated, timeout=30)
        for _ in range(20):  # several rotations past the last file kept
            connect(broker).close()
        files = sorted(p.name for p in path.parent.iterdir())
        assert files == ["warren.log", "warren.log.1", "warren.log.2"]
        for kept in path.parent.iterdir():
            assert kept.stat().st_size <= 4000
            assert "accepting AMQP connection" in kept.read_text() or kept == path
        assert "accepting AMQP connection" not in broker.log_text()  # not on stderr
    finally:
        broker.stop()
    logged = "".join(p.read_text() for p in path.parent.iterdir())
    assert "closing AMQP connection" in logged


def test_shards_log_to_the_same_file(tmp_path):
    path = tmp_path / "warren.log"
    broker = RunningBroker(tmp_path / "data", shards=2,
                           extra_args=["--log-file", str(path)]).start()
    try:
        wait_until(lambda: path.exists() and all(
            f"[info] <shard-{k}> shard {k} starting" in path.read_text() for k in (0, 1)))
    finally:
        broker.stop()


def test_json_lines_parse_and_carry_the_connections_fields(tmp_path):
    broker = RunningBroker(tmp_path / "data", shards=1,
                           extra_args=["--log-format", "json"]).start()
    try:
        conn = connect(broker)
        name = local_name(conn, broker)
        conn.close()

        def records():
            parsed = [json.loads(line) for line in broker.log_text().splitlines() if line]
            closing = [r for r in parsed if r["msg"].startswith("closing AMQP connection")]
            shard = [r for r in parsed if r["process"] == "shard-0"]
            return parsed if closing and shard else None

        parsed = wait_until(records)
    finally:
        broker.stop()
    for record in parsed:
        assert {"time", "level", "logger", "msg", "process"} <= record.keys()
    authenticated = [r for r in parsed if "authenticated and granted" in r["msg"]]
    assert authenticated and authenticated[0]["level"] == "info"
    assert authenticated[0]["logger"] == "warren.connection"
    assert (authenticated[0]["connection"], authenticated[0]["user"],
            authenticated[0]["vhost"]) == (name, "guest", "/")
    assert f"started TCP listener on 127.0.0.1:{broker.port}" in [r["msg"] for r in parsed]
    assert [r["msg"] for r in parsed if r["process"] == "shard-0"] == [
        "shard 0 starting on stores shard-0"]


def test_an_unwritable_log_file_is_one_line_naming_the_option(tmp_path):
    (tmp_path / "file").write_text("")
    broker = RunningBroker(tmp_path / "data", shards=1,
                           extra_args=["--log-file", str(tmp_path / "file" / "warren.log")])
    with pytest.raises(RuntimeError):
        broker.start(timeout=20)
    text = broker.log_text()
    assert f"warren: cannot open log file {tmp_path}/file/warren.log (not a directory): " \
           "pick another with --log-file" in text
    assert "Traceback" not in text
    assert not (tmp_path / "data").exists()
