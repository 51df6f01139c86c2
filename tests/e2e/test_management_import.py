"""A large definitions import does not stop the broker serving its clients
(issue 56: during a 20,000-queue import, which took 16 s, new connections hit
the 10 s handshake timeout)."""

from __future__ import annotations

import base64
import json
import threading
import time
import urllib.request

import pika

from ..support.broker import RunningBroker
from .test_management_api import call

QUEUES = 1000


def test_clients_connect_while_a_large_import_runs(tmp_path, gateway_count):
    broker = RunningBroker(tmp_path / "data", shards=2, management=True).start()
    try:
        document = {"queues": [{"name": f"imported-{i}", "vhost": "/", "durable": True,
                                "auto_delete": False, "arguments": {}}
                               for i in range(QUEUES)]}
        span = {}

        def run_import() -> None:
            request = urllib.request.Request(
                broker.http_url + "/api/definitions", json.dumps(document).encode(),
                {"Content-Type": "application/json", "Authorization": "Basic " +
                 base64.b64encode(b"guest:guest").decode()}, method="POST")
            span["start"] = time.monotonic()
            with urllib.request.urlopen(request, timeout=120) as answer:
                span["status"] = answer.status
            span["end"] = time.monotonic()

        importing = threading.Thread(target=run_import)
        importing.start()
        connected = []  # (started, done) of each connection made meanwhile
        while importing.is_alive():
            started = time.monotonic()
            pika.BlockingConnection(pika.URLParameters(broker.url)).close()
            connected.append((started, time.monotonic()))
        importing.join()
        assert span["status"] == 204
        assert len(call(broker, "GET", "/api/queues/%2F")[1]) == QUEUES
        # a blocked loop answers no handshake until the import ends: with it served,
        # connections begun after the import started are done before it ends
        within = [done - started for started, done in connected
                  if started > span["start"] + 0.2 and done < span["end"]]
        assert span["end"] - span["start"] < 1.5 or len(within) >= 3, (span, connected)
    finally:
        broker.stop()
    assert "Traceback" not in broker.log_text()
