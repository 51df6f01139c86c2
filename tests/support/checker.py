"""A Jepsen-style workload and its checker, for the fault tests of replicated
quorum queues (issue 55).

The Workload publishes persistent messages with confirms, each body a unique
id, through the nodes it is given (never the leader's), with a bounded window
in flight, and keeps a history of every attempt: where and when it was sent,
and how it ended (acked, nacked, or its connection lost). What was not
confirmed is sent again, through the next node when its connection went. After
the fault, `drain` consumes the queue through a surviving node, and `check`
turns the history, what was consumed and the nodes' operator logs into a
Report: what was confirmed and lost (must be none), the duplicates, the longest
stall of confirms, the failover time, and any epoch two nodes led in."""

from __future__ import annotations

import re
import socket
import threading
import time
from collections import deque
from dataclasses import dataclass, field

import pika
import pika.exceptions
import pytest

from warren.gateway.amqp import frames
from warren.gateway.amqp import methods as m
from warren.gateway.amqp.frames import FrameReader

from .rawclient import RawClient

PERSISTENT = bytes.fromhex("1000") + b"\x02"  # property flags: delivery-mode only, = 2
# What a shard logs when it starts to lead a queue (shards/replicas.py); the
# epoch is the leader key's create revision, which no two groups share.
LEADING = re.compile(r"shard \d+: leads queue (\d+) in epoch (\d+)")


@dataclass
class Attempt:
    """One publish of message `id` through `node`."""

    id: int
    node: str
    sent: float
    outcome: str = "pending"  # then "acked", "nacked" or "lost" (its connection went)
    answered: float = 0.0


class _Link(RawClient):
    """A confirming channel on one node, at any address (RawClient's is loopback)."""

    def __init__(self, host: str, port: int, queue: str):
        self.sock = socket.create_connection((host, port), timeout=10)
        self.reader = FrameReader(1 << 20)
        self.timeout = 10.0
        self.handshake()
        self.open_channel(1)
        self.call(1, m.ConfirmSelect(), m.ConfirmSelectOk)
        self.publish_method = m.encode_method(m.BasicPublish(exchange="", routing_key=queue))
        self.pending: dict[int, Attempt] = {}  # by delivery tag, in the order sent
        self.sent = 0
        self.alive = True
        self.closed_by: object = None  # the broker's Close, if it sent one

    def send_publish(self, body: bytes) -> None:
        self.send(frames.content_frames(1, self.publish_method, 60, PERSISTENT, body, 131072))

    def shut(self) -> None:
        try:  # shutdown wakes the reader's recv; close alone would not
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.close()


class Workload:
    def __init__(self, queue: str, routes: list[tuple[str, str, int]], window: int = 32,
                 rate: float = 2000.0):
        """`routes`: (node name, host, port) to publish through, in the order tried;
        at most `window` publishes in flight and `rate` sent a second (so that a
        round's queue drains in moments)."""
        self.queue = queue
        self.routes = routes
        self.window = window
        self.gap = 1.0 / rate
        self._next_send = 0.0
        self.history: list[Attempt] = []
        self.confirmed: set[int] = set()
        self.started = self.stopped = 0.0
        self._lock = threading.Condition()
        self._todo: deque[int] = deque()  # ids to send again
        self._made = 0  # ids 0 .. made-1 exist
        self._fresh = True
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def body(self, message: int) -> bytes:
        return f"{self.queue}:{message}".encode()

    def parse(self, body: bytes) -> int | None:
        """The id in a body of this workload's (None for another's)."""
        queue, _, message = body.decode().rpartition(":")
        return int(message) if queue == self.queue else None

    def start(self) -> Workload:
        self.started = time.monotonic()
        self._thread.start()
        return self

    def stop_fresh(self) -> None:
        """No new messages from now on; what is unconfirmed is still sent again."""
        with self._lock:
            self._fresh = False
            self.stopped = time.monotonic()
            self._lock.notify_all()

    def settle(self, timeout: float) -> bool:
        """Stops fresh publishing and waits until every message is confirmed
        (True), or `timeout` passed; then stops the publisher."""
        if self._fresh:
            self.stop_fresh()
        deadline = time.monotonic() + timeout
        with self._lock:
            while len(self.confirmed) < self._made and time.monotonic() < deadline:
                self._lock.wait(0.1)
            settled = len(self.confirmed) == self._made
        self._done.set()
        self._thread.join(15)
        return settled

    @property
    def published(self) -> int:
        """How many messages there are (each sent once or more)."""
        return self._made

    def first_confirm_after(self, moment: float, among: set[int] | None = None) -> float | None:
        """When the first publish sent after `moment` was acked (None: not yet),
        of the messages `among` if given."""
        with self._lock:
            times = [a.answered for a in self.history if a.outcome == "acked"
                     and a.sent >= moment and (among is None or a.id in among)]
        return min(times, default=None)

    def wait_confirms(self, count: int, timeout: float) -> None:
        """Until `count` messages are confirmed, or fail saying so."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while len(self.confirmed) < count:
                if time.monotonic() > deadline:
                    raise AssertionError(f"{len(self.confirmed)} of {count} messages confirmed "
                                         f"within {timeout} s; {self.outcomes()}")
                self._lock.wait(0.1)

    def outcomes(self) -> dict[str, int]:
        with self._lock:
            counts: dict[str, int] = {}
            for attempt in self.history:
                counts[attempt.outcome] = counts.get(attempt.outcome, 0) + 1
            return counts

    def _run(self) -> None:
        turn = 0
        while not self._done.is_set():
            name, host, port = self.routes[turn % len(self.routes)]
            turn += 1
            try:
                link = _Link(host, port, self.queue)
            except (OSError, AssertionError):  # that node is down, or refuses us
                self._done.wait(0.2)
                continue
            reader = threading.Thread(target=self._read, args=(link,), daemon=True)
            reader.start()
            try:
                self._publish_on(link, name)
            except OSError:
                pass
            finally:
                link.shut()
                reader.join(15)
                self._lost(link)

    def _publish_on(self, link: _Link, name: str) -> None:
        while True:
            with self._lock:
                while not self._done.is_set() and link.alive and (
                        len(link.pending) >= self.window
                        or not self._todo and not self._fresh):
                    self._lock.wait(0.1)
                if self._done.is_set() or not link.alive:
                    return
                now = time.monotonic()
                if now < self._next_send:
                    self._lock.wait(self._next_send - now)
                    continue
                self._next_send = max(self._next_send, now - self.gap) + self.gap
                if self._todo:
                    message = self._todo.popleft()
                else:
                    message, self._made = self._made, self._made + 1
                attempt = Attempt(message, name, time.monotonic())
                link.sent += 1
                link.pending[link.sent] = attempt
                self.history.append(attempt)
            link.send_publish(self.body(message))

    def _read(self, link: _Link) -> None:
        try:
            while True:
                frame = link.next_frame(timeout=3600)
                if frame is None or frame[0] != frames.FRAME_METHOD:
                    if frame is None:
                        break
                    continue
                method = m.decode_method(frame[2])
                if isinstance(method, (m.BasicAck, m.BasicNack)):
                    self._answer(link, method.delivery_tag, method.multiple,
                                 isinstance(method, m.BasicAck))
                elif isinstance(method, (m.ChannelClose, m.ConnectionClose)):
                    link.closed_by = method
                    break
        except (OSError, ValueError):
            pass
        finally:
            with self._lock:
                link.alive = False
                self._lock.notify_all()

    def _answer(self, link: _Link, tag: int, multiple: bool, ack: bool) -> None:
        now = time.monotonic()
        with self._lock:
            tags = [t for t in link.pending if t <= tag] if multiple else [tag]
            for t in tags:
                attempt = link.pending.pop(t, None)
                if attempt is None:
                    continue
                attempt.outcome, attempt.answered = ("acked" if ack else "nacked"), now
                if ack:
                    self.confirmed.add(attempt.id)
                elif attempt.id not in self.confirmed:
                    self._todo.append(attempt.id)
            self._lock.notify_all()

    def _lost(self, link: _Link) -> None:
        now = time.monotonic()
        with self._lock:
            for attempt in link.pending.values():
                attempt.outcome, attempt.answered = "lost", now
                if attempt.id not in self.confirmed:
                    self._todo.append(attempt.id)
            link.pending.clear()
            self._lock.notify_all()


def drain(host: str, port: int, workload: Workload, timeout: float = 30.0,
          quiet: float = 1.0) -> list[int]:
    """Every id consumed from the workload's queue through the node at host:port
    (acked as it comes), until it is empty and nothing came for `quiet` seconds,
    or until `timeout`: what never came counts as lost."""
    got: list[int] = []
    parameters = pika.ConnectionParameters(host, port, connection_attempts=1,
                                           credentials=pika.PlainCredentials("guest", "guest"))
    try:
        return _drain(parameters, workload, got, timeout, quiet)
    except pika.exceptions.AMQPError as error:
        raise AssertionError(f"draining {workload.queue} through {host}:{port} failed after "
                             f"{len(got)} of {len(workload.confirmed)} confirmed: "
                             f"{error!r}") from error


def _drain(parameters, workload: Workload, got: list[int], timeout: float,
           quiet: float) -> list[int]:
    deadline = time.monotonic() + timeout
    with pika.BlockingConnection(parameters) as connection:
        consumer, counter = connection.channel(), connection.channel()
        consumer.basic_qos(prefetch_count=500)
        last = [time.monotonic()]

        def deliver(channel, method, properties, body) -> None:
            message = workload.parse(body)
            assert message is not None, f"a stranger's message in {workload.queue}: {body!r}"
            got.append(message)
            channel.basic_ack(method.delivery_tag)
            last[0] = time.monotonic()

        consumer.basic_consume(workload.queue, deliver)
        while time.monotonic() < deadline:
            connection.process_data_events(0.1)
            if time.monotonic() - last[0] > quiet and counter.queue_declare(
                    workload.queue, passive=True).method.message_count == 0:
                break
    return got


def leaders(logs: dict[str, str]) -> dict[int, set[str]]:
    """Epoch -> the nodes whose shards logged leading in it, from each node's log."""
    found: dict[int, set[str]] = {}
    for node, text in logs.items():
        for match in LEADING.finditer(text):
            found.setdefault(int(match.group(2)), set()).add(node)
    return found


@dataclass
class Report:
    confirmed: int
    lost: list[int]  # confirmed, never consumed
    duplicates: int  # consumptions beyond each message's first
    stall: float  # the longest gap between successive confirms while publishing ran
    failover: float | None  # fault to the first confirm of a publish sent after it, consumed
    unconfirmed: int  # published and never confirmed, however often sent again
    split: dict[int, set[str]] = field(default_factory=dict)  # epochs led by two nodes

    def row(self, round_name: str, fault: str) -> str:
        failover = "-" if self.failover is None else f"{self.failover:.2f}"
        return (f"{round_name:<24} {fault:<42} {self.confirmed:>9} {len(self.lost):>5} "
                f"{self.duplicates:>5} {self.stall:>7.2f} {failover:>8}")


FAULT_ROWS = pytest.StashKey[list]()  # the run's rounds, for the table at its end

HEADER = (f"{'round':<24} {'fault':<42} {'confirmed':>9} {'lost':>5} {'dupes':>5} "
          f"{'stall s':>7} {'failover':>8}")


def check(workload: Workload, consumed: list[int], fault_at: float,
          logs: dict[str, str]) -> Report:
    acks = sorted(a.answered for a in workload.history if a.outcome == "acked"
                  and workload.started <= a.answered <= workload.stopped)
    stall = max((b - a for a, b in zip(acks, acks[1:])), default=0.0)
    seen = set(consumed)
    after = workload.first_confirm_after(fault_at, among=seen)  # a lost one served nobody
    return Report(confirmed=len(workload.confirmed),
                  lost=sorted(workload.confirmed - seen),
                  duplicates=len(consumed) - len(seen),
                  stall=stall,
                  failover=None if after is None else after - fault_at,
                  unconfirmed=workload.published - len(workload.confirmed),
                  split={e: n for e, n in leaders(logs).items() if len(n) > 1})
