"""Failed logins slow down broker-wide: after a few failures from one address, its
further refusals are answered after a growing delay, one after another (AMQP and
the management API alike), while logins from elsewhere are answered at once. The
tests connect from other loopback addresses (127.0.0.2, 127.0.0.3) to be a
separate source; tests/unit/test_login_throttle.py drives the tracker alone."""

from __future__ import annotations

import base64
import http.client
import re
import select
import socket
import time

import pika
import pytest

from warren.gateway.amqp import frames
from warren.gateway.amqp import methods as m

from ..support.broker import RunningBroker
from ..support.rawclient import RawClient

pytestmark = pytest.mark.run_once  # its brokers choose their gateway processes


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    """Two gateway processes: the throttle is the broker's, not each one's."""
    running = RunningBroker(tmp_path_factory.mktemp("throttle") / "data", shards=1,
                            management=True, gateways=2).start()
    yield running
    running.stop()


def answered(sock: socket.socket) -> bool:
    """Has the server answered on `sock` yet (without waiting)?"""
    return bool(select.select([sock], [], [], 0)[0])


def amqp_login(port: int, source: str, password: str) -> RawClient:
    """A client from `source` that sent its credentials and awaits the answer."""
    client = RawClient(port, timeout=20, source=source)
    client.send(frames.PROTOCOL_HEADER)
    assert isinstance(client.next_method()[1], m.ConnectionStart)
    client.send_method(0, m.ConnectionStartOk(
        client_properties={"capabilities": {"authentication_failure_close": True}},
        mechanism="PLAIN", response=b"\0guest\0" + password.encode(), locale="en_US"))
    return client


def refused(client: RawClient) -> bool:
    _, method = client.next_method()
    client.close()
    return isinstance(method, m.ConnectionClose) and method.reply_code == 403


def answer_times(clients: list[RawClient], since: float) -> list[float]:
    """When each client was answered, in seconds after `since`."""
    times: dict[int, float] = {}
    deadline = time.monotonic() + 20
    while len(times) < len(clients) and time.monotonic() < deadline:
        waiting = [c.sock for c in clients if c.sock.fileno() not in times]
        for sock in select.select(waiting, [], [], 0.5)[0]:
            times[sock.fileno()] = time.monotonic() - since
    return [times[c.sock.fileno()] for c in clients]


def test_amqp_guesses_are_throttled_broker_wide_one_at_a_time(broker):
    guesser = "127.0.0.2"
    gateways = [broker.gateway_port(1), broker.gateway_port(2)]
    for n in range(5):  # the free failures, over both gateways
        assert refused(amqp_login(gateways[n % 2], guesser, "wrong"))
    # Then parallel guesses, over both gateways, are checked one at a time: the
    # answers come 0.25, 0.5 and 1 s apart (each gateway had had only 2 or 3
    # failures of its own, and answered all of them at once).
    began = time.monotonic()
    pending = [amqp_login(gateways[n % 2], guesser, "wrong") for n in range(3)]
    # meanwhile the right password gets in at once from elsewhere
    pika.BlockingConnection(pika.URLParameters(broker.url)).close()
    assert time.monotonic() - began < 0.25
    times = sorted(answer_times(pending, began))
    assert [round(t, 1) for t in times] >= [0.2, 0.7, 1.7], times
    assert times[2] - times[0] >= 1.4, times  # one after another, not all at once
    assert all(refused(client) for client in pending)
    # and from the guesser's address too, at its turn
    RawClient(gateways[1], source=guesser).handshake()
    assert time.monotonic() - began > 3.5  # 2 s after the last refusal
    # (the last waited its turn: 1.75 s from when its gateway asked)
    assert re.search(r"PLAIN login refused: user 'guest' - invalid credentials "
                     r"\(from 127\.0\.0\.2, answered in 1\.7\d*s\)", broker.log_text())


def http_login(broker, source: str, password: str) -> socket.socket:
    """A socket from `source` that sent a request with Basic credentials."""
    port = broker.listener_port("http")
    sock = socket.create_connection(("127.0.0.1", port), timeout=20, source_address=(source, 0))
    auth = base64.b64encode(f"guest:{password}".encode()).decode()
    sock.sendall(f"GET /api/whoami HTTP/1.1\r\nHost: w\r\nAuthorization: Basic {auth}\r\n"
                 "Connection: close\r\n\r\n".encode())
    return sock


def status(sock: socket.socket) -> int:
    reply = b""
    while chunk := sock.recv(65536):
        reply += chunk
    sock.close()
    return int(reply.split(b" ", 2)[1])


def test_management_guesses_wait_while_others_log_in(broker):
    guesser = "127.0.0.3"
    for _ in range(5):
        assert status(http_login(broker, guesser, "wrong")) == 401
    began = time.monotonic()
    pending = [http_login(broker, guesser, "wrong") for _ in range(3)]
    elsewhere = http.client.HTTPConnection("127.0.0.1", broker.listener_port("http"), timeout=20)
    elsewhere.request("GET", "/api/whoami", headers={
        "Authorization": "Basic " + base64.b64encode(b"guest:guest").decode()})
    assert elsewhere.getresponse().status == 200
    assert time.monotonic() - began < 0.25
    assert not all(answered(sock) for sock in pending)
    # the right password from the guesser's address too, but at its turn, as AMQP's:
    # 2 s after the last refusal (the old code let it in at once)
    right = http_login(broker, guesser, "guest")
    assert [status(sock) for sock in pending] == [401] * 3
    assert status(right) == 200
    assert time.monotonic() - began > 3.5
    # one after another: 0.25, 0.25 + 0.5, 0.75 + 1 s
    # (the loop's timers are as precise as a loaded machine lets them be: 1.74 s seen)
    assert re.search(r"HTTP access denied: user 'guest' - invalid credentials "
                     r"\(from 127\.0\.0\.3, answered in 1\.7\ds\)", broker.log_text())
