"""Failed logins slow down: after a few failures from one address, broker-wide,
its further refusals are answered after a growing delay, one after another
(AMQP and the management API alike), its further logins are checked only
at their turn, and refusals broker-wide are bounded per second, while logins
from elsewhere are answered at once. The tracker is a pure class, driven here
by an explicit clock; the broker tests connect from other loopback addresses
(127.0.0.2, 127.0.0.3) to be a separate source."""

from __future__ import annotations

import base64
import http.client
import logging
import re
import select
import socket
import time

import pika
import pytest

from warren.gateway.amqp import frames
from warren.gateway.amqp import methods as m
from warren.gateway.broker.access import AccessControl
from warren.gateway.broker.auth import LoginThrottle

from ..support.broker import RunningBroker
from ..support.rawclient import RawClient

pytestmark = pytest.mark.run_once  # its brokers choose their gateway processes


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def guess(throttle: LoginThrottle, clock: Clock, address: str) -> float:
    """One failed login as a connection makes it, one after another: it waits its
    turn if its address is throttled, then its refusal's delay. The seconds from
    its credentials to its refusal."""
    began = clock.now
    at_turn = throttle.throttled(address)
    if at_turn:
        clock.now += throttle.turn(address)
    clock.now += throttle.failed(address, at_turn)
    return clock.now - began


def test_delays_start_after_the_free_failures_and_double_to_the_cap():
    clock = Clock()
    throttle = LoginThrottle(free=3, first=0.5, cap=4.0, clock=clock)
    assert [guess(throttle, clock, "192.0.2.1") for _ in range(9)] == \
        [0, 0, 0, 0.5, 1, 2, 4, 4, 4]
    assert guess(throttle, clock, "192.0.2.2") == 0  # another address starts afresh


def test_parallel_refusals_from_one_address_come_one_after_another():
    throttle = LoginThrottle(free=2, first=0.5, cap=4.0, longest=10.0, clock=Clock())
    # all at once, before the address is throttled: each waits for the one before
    assert [throttle.failed("192.0.2.1") for _ in range(7)] == \
        [0, 0, 0.5, 1.5, 3.5, 7.5, 10]  # no answer waits more than `longest`


def test_a_throttled_address_s_logins_are_checked_one_at_a_time():
    clock = Clock()
    throttle = LoginThrottle(free=2, first=0.5, cap=2.0, longest=5.0, clock=clock)
    assert not throttle.throttled("192.0.2.1")
    assert throttle.turn("192.0.2.1") == 0  # not throttled: checked at once
    throttle.failed("192.0.2.1")
    throttle.failed("192.0.2.1")
    assert throttle.throttled("192.0.2.1")
    # parallel attempts: each turn comes a delay after the one before (taken as
    # failing), and one too far off is refused unchecked
    assert [throttle.turn("192.0.2.1") for _ in range(4)] == [0.5, 1.5, 3.5, None]
    clock.now += 0.5
    assert throttle.failed("192.0.2.1", at_turn=True) == 0  # it waited already
    assert not throttle.throttled("192.0.2.2")


def test_refusals_broker_wide_are_bounded_per_second_and_none_is_free_beyond():
    clock = Clock()
    throttle = LoginThrottle(free=5, first=0.25, per_second=10.0, longest=30.0, clock=clock)
    # 100 addresses failing at once, each within its free failures: a second's
    # worth of refusals come at once, then 10 a second
    delays = [throttle.failed(f"192.0.2.{n}") for n in range(100)]
    # and over that rate no failure is free: each waits `first` at least
    assert delays == pytest.approx([0] * 10 + [max(0.25, n / 10) for n in range(1, 91)])
    clock.now += 60  # the flood is over: free again
    assert throttle.failed("198.51.100.2") == 0


def test_an_address_is_forgotten_after_a_quiet_while():
    clock = Clock()
    throttle = LoginThrottle(free=1, first=1.0, cap=8.0, forget_after=60.0, clock=clock)
    assert [guess(throttle, clock, "192.0.2.1") for _ in range(3)] == [0, 1, 2]
    clock.now += 59
    assert throttle.throttled("192.0.2.1")  # still remembered
    guess(throttle, clock, "192.0.2.1")  # which renews it
    clock.now += 59
    assert throttle.throttled("192.0.2.1")
    clock.now += 60
    assert not throttle.throttled("192.0.2.1")
    assert throttle.failed("192.0.2.9") == 0
    assert len(throttle) == 1  # 192.0.2.1 was forgotten
    assert throttle.failed("192.0.2.1") == 0


def test_memory_is_bounded_by_forgetting_the_quietest_address():
    clock = Clock()
    throttle = LoginThrottle(free=1, first=1.0, max_addresses=3, per_second=1e6, clock=clock)
    for address in ("192.0.2.1", "192.0.2.2", "192.0.2.3"):
        throttle.failed(address)
        clock.now += 1
    throttle.failed("192.0.2.1")  # a second failure, and now the most recent
    throttle.failed("192.0.2.4")
    assert len(throttle) == 3 and throttle.throttled("192.0.2.1")  # 192.0.2.2 went
    assert not throttle.throttled("192.0.2.2")
    for n in range(5, 1000):
        throttle.failed(f"192.0.2.{n}")
    assert len(throttle) == 3
    assert not throttle.throttled("192.0.2.1")  # pushed out


def test_the_delay_stays_at_the_cap_however_many_failures():
    clock = Clock()
    throttle = LoginThrottle(free=0, first=0.25, cap=3.0, clock=clock)
    assert max(guess(throttle, clock, "192.0.2.1") for _ in range(5000)) == 3.0


def test_refusals_are_logged_and_counted_per_address(caplog):
    access = AccessControl(None)
    access.put_user("alice", "pw", [])
    access.throttle = LoginThrottle(free=2, first=1.0, clock=Clock())

    def refuse(name: str, password: str, address: str) -> float:
        delays = []
        access.login_failed(name, access.refusal(name, password, address), address, "PLAIN",
                            False, 0.0, delays.append)
        return delays[0]

    with caplog.at_level(logging.WARNING, logger="warren.access"):
        answers = [refuse("alice", "nope", "192.0.2.7") for _ in range(4)]
        assert refuse("mallory", "x", "192.0.2.8") == 0
    assert answers == [0, 0, 1, 3]  # one after another
    assert access.refusal("alice", "pw", "192.0.2.7") is None
    assert caplog.messages[0] == \
        "PLAIN login refused: user 'alice' - invalid credentials (from 192.0.2.7)"
    assert caplog.messages[3] == \
        "PLAIN login refused: user 'alice' - invalid credentials (from 192.0.2.7, answered in 3s)"
    assert caplog.messages[4] == \
        "PLAIN login refused: user 'mallory' - invalid credentials (from 192.0.2.8)"


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
    assert ("HTTP access denied: user 'guest' - invalid credentials "
            "(from 127.0.0.3, answered in 1.75s)") in broker.log_text()
