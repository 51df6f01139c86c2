"""`warren inspect` on a data directory, offline and beside a running broker."""

from __future__ import annotations

import json
import subprocess
import sys

import pika
import pytest

from ..support.broker import ROOT, RunningBroker

pytestmark = pytest.mark.run_once  # its brokers choose their gateway processes


def inspect(data, *args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "warren.gateway.cli.main", "inspect", str(data), *args],
                          capture_output=True, text=True, timeout=30, cwd=ROOT)


def test_inspect_lists_queues_and_messages_while_running_and_offline(tmp_path):
    data = tmp_path / "data"
    broker = RunningBroker(data, shards=2).start()
    try:
        conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", broker.port))
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare("orders", durable=True, arguments={"x-note": "kept"})
        ch.queue_declare("transient", durable=False)
        for i in range(3):
            ch.basic_publish("", "orders", f"order {i}".encode(), pika.BasicProperties(
                delivery_mode=2, content_type="text/plain", headers={"n": i}))
        # While the broker runs (and holds its environments open):
        listing = json.loads(inspect(data, "--json").stdout)
        assert listing["vhosts"] == ["/"]
        [orders] = [q for q in listing["queues"] if q["name"] == "orders"]
        assert orders["messages"] == 3 and orders["durable"] is True
        assert orders["arguments"] == {"x-note": "kept"}
        assert not any(q["name"] == "transient" for q in listing["queues"])
        conn.close()
    finally:
        broker.stop()
    shown = json.loads(inspect(data, "--queue", "orders", "--limit", "2", "--json").stdout)
    assert [m["body"] for m in shown["messages"]] == ["order 0", "order 1"]
    assert shown["messages"][0]["properties"] == {"content_type": "text/plain",
                                                  "headers": {"n": 0}, "delivery_mode": 2}
    table = inspect(data)
    assert table.returncode == 0 and "orders" in table.stdout and "messages" in table.stdout


def test_inspect_refuses_a_directory_without_metadata(tmp_path):
    result = inspect(tmp_path)
    assert result.returncode == 2 and "no Warren data directory" in result.stderr
