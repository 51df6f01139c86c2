"""Management connections that trickle their requests (issue 56): under a low
descriptor limit, a thousand of them used to stop the broker accepting AMQP
connections. Now a request must arrive whole within management_request_timeout,
connections are capped per address and in all (to a quarter of the descriptor
limit), and AMQP clients connect, publish and consume meanwhile."""

from __future__ import annotations

import json
import resource
import socket
import time

import pika
import pytest

from ..support.broker import RunningBroker, wait_until
from .test_management_api import call

# HTTP is the root's; the AMQP clients beside it land on any gateway process
pytestmark = pytest.mark.most_gateways

DESCRIPTORS = 256  # the broker's limit, soft and hard: HTTP may hold 64 of them
PER_ADDRESS = 8
TIMEOUT = 4.0
HEAD = b"GET /api/overview HTTP/1.1\r\nHost: warren\r\nAuthorization: Basic Z3Vlc3Q6Z3Vlc3Q="


def _low_limit() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (DESCRIPTORS, DESCRIPTORS))


@pytest.fixture(scope="module")
def broker(tmp_path_factory, gateway_count):
    broker = RunningBroker(tmp_path_factory.mktemp("slowloris") / "data", shards=1,
                           management=True, preexec_fn=_low_limit, extra_args=[
                               "--management-request-timeout", str(TIMEOUT),
                               "--management-max-connections-per-address",
                               str(PER_ADDRESS)]).start()
    yield broker
    broker.stop()
    assert "Traceback" not in broker.log_text()


class Slow:
    """A connection from `source` that sends the start of a request head, then a
    byte at a time when told to."""

    def __init__(self, port: int, source: str):
        self.sock = socket.socket()
        self.sock.bind((source, 0))
        self.sock.settimeout(5)
        self.sock.connect(("127.0.0.1", port))
        self.sock.sendall(HEAD[:20])
        self.sock.setblocking(False)
        self.sent = 20
        self.answer = b""
        self.closed = False

    def trickle(self) -> None:
        try:
            self.sock.send(HEAD[self.sent:self.sent + 1])
            self.sent += 1
        except OSError:
            pass

    def answered(self) -> bool:
        """Whether the broker answered or closed it (without waiting)."""
        if self.closed:
            return True
        try:
            data = self.sock.recv(4096)
        except BlockingIOError:
            return bool(self.answer)
        except ConnectionResetError:
            data = b""
        self.answer += data
        self.closed = not data
        return True

    def refusal(self) -> dict:
        status, _, body = self.answer.partition(b"\r\n\r\n")
        assert status.startswith(b"HTTP/1.1 503"), self.answer
        return json.loads(body)


def _settled(slow: list[Slow], refused: int) -> list[Slow]:
    """The connections held once `refused` of them have been refused."""
    wait_until(lambda: sum(s.answered() for s in slow) >= refused, timeout=TIMEOUT / 2)
    return [s for s in slow if not s.answered()]


def test_slow_clients_are_capped_and_cut_while_amqp_is_served(broker):
    port = broker.listener_port("http")
    # one address: all but PER_ADDRESS refused at once
    mine = [Slow(port, "127.0.0.1") for _ in range(40)]
    held = _settled(mine, 40 - PER_ADDRESS)
    assert len(held) == PER_ADDRESS
    assert mine[-1].refusal() == {
        "error": "service_unavailable",
        "reason": f"{PER_ADDRESS} management connections from 127.0.0.1 are open"}
    # many addresses: the rest of the cap (a quarter of the 256 descriptors) taken
    many = [Slow(port, f"127.0.0.{2 + i // PER_ADDRESS}") for i in range(PER_ADDRESS * 12)]
    held += _settled(many, len(many) - (DESCRIPTORS // 4 - PER_ADDRESS))
    assert len(held) == DESCRIPTORS // 4
    assert many[-1].refusal() == {"error": "service_unavailable",
                                  "reason": "64 management connections are open"}

    # AMQP clients have descriptors left: they connect, publish and consume
    connections = [pika.BlockingConnection(pika.URLParameters(broker.url)) for _ in range(30)]
    channel = connections[0].channel()
    channel.confirm_delivery()
    channel.queue_declare("canary")
    channel.basic_publish("", "canary", b"alive")
    assert channel.basic_get("canary", auto_ack=True)[2] == b"alive"
    for connection in connections:
        connection.close()

    # trickling does not keep them: each is cut when its request is not whole in time
    def all_cut() -> bool:
        for s in held:
            s.trickle()
        return all(s.answered() for s in held)
    wait_until(all_cut, timeout=TIMEOUT + 5, interval=0.2, message="slow clients still held")
    assert all(s.closed and not s.answer for s in held)
    assert call(broker, "GET", "/api/whoami")[0] == 200
    for s in mine + many:
        s.sock.close()
    log = broker.log_text()
    assert "management listener: refused a connection" in log


def test_a_trickled_body_is_cut_too(broker):
    # RabbitMQ 3.10.8 keeps such a connection open (400 s and counting)
    sock = socket.create_connection(("127.0.0.1", broker.listener_port("http")))
    sock.sendall(b"PUT /api/vhosts/trickled HTTP/1.1\r\nHost: warren\r\n"
                 b"Authorization: Basic Z3Vlc3Q6Z3Vlc3Q=\r\nContent-Length: 100\r\n\r\n{")
    sock.setblocking(False)
    started = time.monotonic()

    def cut() -> bool:
        try:
            sock.send(b" ")
            return sock.recv(4096) == b""
        except BlockingIOError:
            return False
        except OSError:
            return True
    wait_until(cut, timeout=TIMEOUT + 5, interval=0.5, message="a trickled body still read")
    assert time.monotonic() - started >= TIMEOUT - 0.5
    sock.close()
    assert call(broker, "GET", "/api/vhosts/trickled")[0] == 404


def test_the_soft_descriptor_limit_is_raised_to_the_hard_one(tmp_path):
    hard = min(resource.getrlimit(resource.RLIMIT_NOFILE)[1], 4096)

    def low_soft_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))

    broker = RunningBroker(tmp_path / "data", shards=1, preexec_fn=low_soft_limit).start()
    try:
        assert resource.prlimit(broker.process.pid, resource.RLIMIT_NOFILE) == (hard, hard)
        assert f"raised the open descriptor limit from 256 to {hard}" in broker.log_text()
    finally:
        broker.stop()
