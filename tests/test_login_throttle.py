"""Failed logins slow down: after a few failures from one address, its further
refusals are answered after a growing delay (AMQP and the management API
alike), while logins from elsewhere are answered at once. The tracker is a
pure class, driven here by an explicit clock; the broker tests connect from
other loopback addresses (127.0.0.2, 127.0.0.3) to be a separate source."""

from __future__ import annotations

import base64
import http.client
import logging
import select
import socket

import pika
import pytest

from warren.gateway.access import AccessControl
from warren.gateway.amqp import frames
from warren.gateway.amqp import methods as m
from warren.gateway.auth import LoginThrottle

from .conftest import RunningBroker
from .rawclient import RawClient


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_delays_start_after_the_free_failures_and_double_to_the_cap():
    throttle = LoginThrottle(free=3, first=0.5, cap=4.0, clock=Clock())
    delays = [throttle.failed("192.0.2.1") for _ in range(9)]
    assert delays == [0, 0, 0, 0.5, 1, 2, 4, 4, 4]
    assert throttle.failed("192.0.2.2") == 0  # another address starts afresh


def test_an_address_is_forgotten_after_a_quiet_while():
    clock = Clock()
    throttle = LoginThrottle(free=1, first=1.0, cap=8.0, forget_after=60.0, clock=clock)
    assert [throttle.failed("192.0.2.1") for _ in range(3)] == [0, 1, 2]
    clock.now += 59
    assert throttle.failed("192.0.2.1") == 4  # still remembered: each failure renews it
    clock.now += 60
    assert throttle.failed("192.0.2.9") == 0
    assert len(throttle) == 1  # 192.0.2.1 was forgotten
    assert throttle.failed("192.0.2.1") == 0


def test_memory_is_bounded_by_forgetting_the_quietest_address():
    clock = Clock()
    throttle = LoginThrottle(free=1, first=1.0, max_addresses=3, clock=clock)
    for address in ("192.0.2.1", "192.0.2.2", "192.0.2.3"):
        throttle.failed(address)
        clock.now += 1
    assert throttle.failed("192.0.2.1") == 1  # a second failure, and now the most recent
    for n in range(4, 1000):
        throttle.failed(f"192.0.2.{n}")
    assert len(throttle) == 3
    assert throttle.failed("192.0.2.1") == 0  # pushed out: counted from one again


def test_the_delay_stays_at_the_cap_however_many_failures():
    throttle = LoginThrottle(free=0, first=0.25, cap=3.0, clock=Clock())
    assert max(throttle.failed("192.0.2.1") for _ in range(5000)) == 3.0


def test_refusals_are_logged_and_counted_per_address(caplog):
    access = AccessControl(None)
    access.put_user("alice", "pw", [])
    access.throttle = LoginThrottle(free=2, first=1.0, clock=Clock())
    with caplog.at_level(logging.WARNING, logger="warren.access"):
        answers = [access.login("alice", "nope", "192.0.2.7") for _ in range(4)]
        assert access.login("mallory", "x", "192.0.2.8") == (None, 0)
    assert answers == [(None, 0), (None, 0), (None, 1), (None, 2)]
    assert access.login("alice", "pw", "192.0.2.7") == (access.users["alice"], 0)
    assert caplog.messages[0] == \
        "PLAIN login refused: user 'alice' - invalid credentials (from 192.0.2.7)"
    assert caplog.messages[3] == \
        "PLAIN login refused: user 'alice' - invalid credentials (from 192.0.2.7, answered in 2s)"
    assert caplog.messages[4] == \
        "PLAIN login refused: user 'mallory' - invalid credentials (from 192.0.2.8)"


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    running = RunningBroker(tmp_path_factory.mktemp("throttle") / "data", shards=1,
                            management=True).start()
    yield running
    running.stop()


def answered(sock: socket.socket) -> bool:
    """Has the server answered on `sock` yet (without waiting)?"""
    return bool(select.select([sock], [], [], 0)[0])


def amqp_login(broker, source: str, password: str) -> RawClient:
    """A client from `source` that sent its credentials and awaits the answer."""
    client = RawClient(broker.port, timeout=20, source=source)
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


def test_amqp_guesses_wait_while_others_log_in(broker):
    guesser = "127.0.0.2"
    for _ in range(5):  # the free failures
        assert refused(amqp_login(broker, guesser, "wrong"))
    # the next ones wait 0.25, 0.5, 1, 2, 4 and 4 seconds
    pending = [amqp_login(broker, guesser, "wrong") for _ in range(6)]
    # meanwhile the right password gets in, from elsewhere and from there too
    pika.BlockingConnection(pika.URLParameters(broker.url)).close()
    RawClient(broker.port, source=guesser).handshake()
    assert not all(answered(client.sock) for client in pending)  # the 4s ones at least
    assert all(refused(client) for client in pending)
    assert ("PLAIN login refused: user 'guest' - invalid credentials "
            "(from 127.0.0.2, answered in 4s)") in broker.log_text()


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
    pending = [http_login(broker, guesser, "wrong") for _ in range(6)]
    elsewhere = http.client.HTTPConnection("127.0.0.1", broker.listener_port("http"), timeout=20)
    elsewhere.request("GET", "/api/whoami", headers={
        "Authorization": "Basic " + base64.b64encode(b"guest:guest").decode()})
    assert elsewhere.getresponse().status == 200
    assert status(http_login(broker, guesser, "guest")) == 200
    assert not all(answered(sock) for sock in pending)
    assert [status(sock) for sock in pending] == [401] * 6
    assert ("HTTP access denied: user 'guest' - invalid credentials "
            "(from 127.0.0.3, answered in 4s)") in broker.log_text()
