"""Fuzz a running broker over TCP while a healthy client works beside it (issue 17).

A pika client in confirm mode publishes persistent messages to a queue on every
shard and takes some back, in a loop, for the whole run; meanwhile mutated AMQP
streams (tests/amqpfuzz.py) arrive on other connections, a few at a time.
Afterwards: every broker process is alive with the pid it started with, the
healthy client had every publish confirmed and never got stuck, what the fuzz
connections got back was well-formed, the broker logged no traceback, and a
fresh client still works.

    WARREN_FUZZ_TCP_CASES=2000 pytest tests/e2e/test_fuzz_tcp.py   # more cases
    WARREN_FUZZ_SEED=27000042 pytest tests/e2e/test_fuzz_tcp.py    # replay one
"""

from __future__ import annotations

import socket
import struct
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pika
import pytest

from ..support.amqpfuzz import Case, case_seeds, check_output, make_case
from ..support.broker import RunningBroker
from .test_e2e_basic import names_on_every_shard, shard_pids

pytestmark = [pytest.mark.slow, pytest.mark.run_once]  # its brokers choose their gateway processes

QUIET = 0.15  # a fuzz connection is done when the broker said nothing for this long
CASE_DEADLINE = 3.0
WORKERS = 4
STUCK = 20.0  # the healthy client waited this long for one confirm: the broker is stuck


class HealthyClient(threading.Thread):
    """Publishes with confirms and gets messages back until told to stop."""

    def __init__(self, port: int, queues: list[str]):
        super().__init__(daemon=True)
        self.port = port
        self.queues = queues
        self.stop = threading.Event()
        self.published = 0
        self.confirmed = 0
        self.got = 0
        self.errors: list[str] = []
        self.last_progress = time.monotonic()

    def run(self) -> None:
        try:
            conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", self.port))
            ch = conn.channel()
            ch.confirm_delivery()
            for queue in self.queues:
                ch.queue_declare(queue, durable=True)
            props = pika.BasicProperties(delivery_mode=2)
            n = 0
            while not self.stop.is_set():
                queue = self.queues[n % len(self.queues)]
                self.published += 1
                ch.basic_publish("", queue, struct.pack(">Q", n), props, mandatory=True)
                self.confirmed += 1  # basic_publish returned: the broker acked it
                if n % 4 == 0:
                    method, _, _ = ch.basic_get(queue, auto_ack=True)
                    self.got += method is not None
                self.last_progress = time.monotonic()
                n += 1
            conn.close()
        except Exception as error:  # noqa: BLE001 - reported by the test
            self.errors.append(repr(error))


def fuzz_over_tcp(port: int, case: Case) -> list[str]:
    """Send one case on its own connection; the problems in what came back."""
    problems: list[str] = []
    received = bytearray()
    eof = reset = False
    # From a loopback address of its own (Linux routes all of 127/8 to lo): the
    # broker throttles refused logins per address.
    source = f"127.{case.seed >> 16 & 255}.{case.seed >> 8 & 255}.{case.seed & 255 or 1}"
    sock = socket.create_connection(("127.0.0.1", port), timeout=CASE_DEADLINE,
                                    source_address=(source, 0))
    try:
        for piece in case.pieces():
            try:
                sock.sendall(piece)
            except OSError:  # the broker hung up already
                break
        deadline = time.monotonic() + CASE_DEADLINE
        sock.settimeout(QUIET)
        while time.monotonic() < deadline:
            try:
                data = sock.recv(65536)
            except socket.timeout:
                break
            except ConnectionResetError:  # we wrote after its close: unread data is gone
                reset = True
                break
            if not data:
                eof = True
                break
            received += data
    finally:
        if case.seed % 3 == 0:  # sometimes leave with a reset instead of a FIN
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()
    verdict = check_output(bytes(received))
    problems += verdict.problems
    if eof and not reset:
        if verdict.partial:
            problems.append("the broker's output ends inside a frame")
        if not verdict.hang_up_explained():
            problems.append("the broker hung up without connection.close")
    return problems


def run_tcp_fuzz(tmp_path, seeds: list[int]) -> None:
    broker = RunningBroker(tmp_path / "data", shards=2).start()
    healthy = None
    try:
        pids = sorted(shard_pids(broker))
        assert len(pids) == 2
        healthy = HealthyClient(broker.port, names_on_every_shard(2, per_shard=1,
                                                                  prefix="healthy"))
        healthy.start()
        failures: list[tuple[int, list[str]]] = []
        ran = 0
        started = time.monotonic()
        with ThreadPoolExecutor(WORKERS) as pool:
            results = pool.map(
                lambda seed: (seed, fuzz_over_tcp(broker.port, make_case(seed))), seeds)
            for seed, problems in results:
                ran += 1
                if problems:
                    failures.append((seed, problems))
                if (time.monotonic() - healthy.last_progress > STUCK
                        or not healthy.is_alive()):
                    pool.shutdown(cancel_futures=True)  # no point going on
                    break
        elapsed = time.monotonic() - started
        healthy.stop.set()
        healthy.join(STUCK)
        print(f"\nfuzz: {ran} of {len(seeds)} TCP cases from seed {seeds[0] if seeds else '-'} in "
              f"{elapsed:.1f}s; healthy client: {healthy.published} published, "
              f"{healthy.confirmed} confirmed, {healthy.got} got back; "
              f"{len(failures)} failing cases")
        for seed, problems in failures[:20]:
            print(f"FAILING CASE (replay: WARREN_FUZZ_SEED={seed}): {make_case(seed).describe()}")
            for problem in problems[:3]:
                print("    " + problem)
        log = broker.log_text()
        crash = log.find("Traceback")
        broken = []
        if crash >= 0:
            broken.append("the broker logged:\n" + log[max(0, crash - 300):crash + 4000])
        if healthy.is_alive():
            broken.append(f"the healthy client made no progress for {STUCK}s (stuck after "
                          f"publish {healthy.published}, {healthy.got} got back)")
        if healthy.errors:
            broken.append(f"the healthy client failed: {healthy.errors}")
        if not 0 < healthy.confirmed == healthy.published:
            broken.append(f"the healthy client had {healthy.confirmed} of "
                          f"{healthy.published} publishes confirmed")
        if broker.process.poll() is not None:
            broken.append("the gateway died")
        elif sorted(shard_pids(broker)) != pids:
            broken.append("a shard process died and was replaced")
        if failures:
            broken.append(f"{len(failures)} failing cases, seeds {[s for s, _ in failures[:50]]}")
        assert not broken, "\n".join(broken)
        # A fresh client still gets its work done.
        conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", broker.port))
        ch = conn.channel()
        ch.confirm_delivery()
        queue = ch.queue_declare("", exclusive=True).method.queue
        ch.basic_publish("", queue, b"after the fuzz", mandatory=True)
        assert ch.basic_get(queue, auto_ack=True)[2] == b"after the fuzz"
        conn.close()
    finally:
        if healthy is not None:
            healthy.stop.set()
        broker.stop()


def test_fuzz_over_tcp_beside_a_healthy_client(tmp_path):
    run_tcp_fuzz(tmp_path, case_seeds(300, default_base=27_000_000,
                                      count_var="WARREN_FUZZ_TCP_CASES"))


@pytest.mark.soak
def test_fuzz_over_tcp_soak(tmp_path):
    run_tcp_fuzz(tmp_path, case_seeds(5000, default_base=None,
                                      count_var="WARREN_FUZZ_TCP_CASES"))
