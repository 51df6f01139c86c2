"""Fuzz the connection state machine in-process (issue 17).

One Gateway with its shard's core runs in this thread (tests/support/session.py);
each fuzz case (tests/support/amqpfuzz.py) is fed to a fresh
session.connection.Connection over a Wire. Properties, per case:

* no exception escapes receive, none is raised by what the clock runs (a
  shard's events handed over, a timer, a flush), and the broker logs
  no error (its safety net turns a bug into a logged 541 INTERNAL_ERROR close);
* what the broker wrote is well-formed, and every connection.close or
  channel.close carries a reply code the spec defines;
* the case ends either closed after a well-formed connection.close (or the
  client's own close, a refused protocol header or login), or still operating:
  a connection.close from the client then gets its close-ok;
* no channel waits for a shard for ever, and the connection leaves nothing
  behind (channels, exclusive queues) once it is gone;

and every few hundred cases, and at the end, a fresh healthy connection still
completes declare / publish / confirm / get on that same broker.

    WARREN_FUZZ_CASES=20000 pytest tests/session/test_fuzz_connection.py   # more cases
    WARREN_FUZZ_SEED=17000123 pytest tests/session/test_fuzz_connection.py # replay one
"""

from __future__ import annotations

import struct
import time
import traceback

import pytest

from warren.gateway.amqp import frames, spec
from warren.gateway.amqp import methods as m
from warren.gateway.session.connection import Connection
from warren.gateway.session.lifecycle import AWAIT_HEADER, CLOSED

from ..support.amqpfuzz import Case, case_seeds, check_output, make_case
from ..support.session import TIMEOUT as SETTLE_TIMEOUT
from ..support.session import Client, InlineBroker, Wire, inline_broker

HEALTH_EVERY = 500


class Harness:
    """Fuzz cases against an InlineBroker, whose errors count as the case's."""

    def __init__(self, broker: InlineBroker):
        self.broker = broker
        self.gateway = broker.gateway
        self.errors = broker.errors
        self.last_verdict = None
        self.notes = 0  # oddities check_output noted but does not count as failures

    def run_case(self, case: Case) -> list[str]:
        """Feed one case to a fresh connection; the problems found."""
        broker = self.broker
        broker.current = f"case seed {case.seed}"
        errors_before = len(self.errors)
        problems: list[str] = []
        conn = Connection(self.gateway)
        # A loopback address of its own: the broker's throttle of refused logins
        # (per address) would otherwise change how later cases are answered.
        peer = (f"127.{case.seed >> 16 & 255}.{case.seed >> 8 & 255}.{case.seed & 255}", 40000)
        wire = Wire(conn, broker.clock, peer)
        conn.start(wire, broker.clock, peer, ("127.0.0.1", 5672))
        for piece in case.pieces():
            if wire.closed:
                break
            if wire.paused and not broker.run(lambda: not wire.paused or wire.closed,
                                              SETTLE_TIMEOUT):
                problems.append(f"reading stayed paused for {SETTLE_TIMEOUT}s")
                break
            try:
                conn.receive(piece)
            except Exception as error:  # noqa: BLE001 - the property under test
                problems.append("exception escaped receive:\n"
                                + "".join(traceback.format_exception(error)))
                break
            broker.clock.step()  # shard answers may come between two reads
        if not broker.run(lambda: broker.quiet([conn]), SETTLE_TIMEOUT):
            waiting = [n for n, ch in conn.channels.items() if ch._waiting and not ch.closed]
            problems.append(f"not quiet after {SETTLE_TIMEOUT}s: channels {waiting} wait "
                            "for a shard (a wedged shard link?)")
        verdict = self.last_verdict = check_output(bytes(wire.written))
        problems += verdict.problems
        self.notes += len(verdict.notes)
        if verdict.partial:
            problems.append("the broker's output ends inside a frame")
        if wire.closed or conn.state == CLOSED:  # hung up, or lingering after close-ok
            if not verdict.hang_up_explained():
                problems.append("the broker hung up without connection.close")
        elif conn.state != AWAIT_HEADER and not wire.paused and not _buffered(conn):
            # Still operating: the client's connection.close gets its close-ok.
            before = len(wire.written)
            try:
                conn.receive(frames.method_frame(0, m.ConnectionClose(
                    reply_code=200, reply_text="fuzz done")))
            except Exception as error:  # noqa: BLE001
                problems.append("exception escaped receive (closing):\n"
                                + "".join(traceback.format_exception(error)))
            # close-ok, then the broker drops what follows until the client hangs up
            broker.run(lambda: conn.state == CLOSED, 1.0)
            after = check_output(bytes(wire.written[before:]))
            if not (conn.state == CLOSED and after.has(m.ConnectionCloseOk)):
                problems.append(f"no close-ok for the client's connection.close (state "
                                f"{conn.state}, output {bytes(wire.written[before:])[:80]!r})")
        wire.close()  # the client goes away
        broker.run(lambda: conn.state == CLOSED
                   and conn not in self.gateway.registry.connections, 1.0)
        broker.clock.step()
        problems += self._leftovers(conn)
        if wire.writes_after_close:
            problems.append(f"{wire.writes_after_close} writes after the output closed")
        problems += self.errors[errors_before:]
        return problems

    def _leftovers(self, conn: Connection) -> list[str]:
        problems = []
        if conn in self.gateway.registry.connections:
            problems.append("the connection is still listed after connection_lost")
        held = [h for h, ch in self.gateway.registry.holders.items() if ch.conn is conn]
        if held:
            problems.append(f"holders {held} of a closed connection are still registered")
        owned = [q.spec.name for q in self.gateway.catalogue.queues_by_qid.values() if q.owner is conn]
        if owned:
            problems.append(f"exclusive queues {owned} outlive their connection")
        return problems

    def healthy_roundtrip(self, label: str) -> None:
        """A well-behaved client: declare, publish, confirm, get. Raises AssertionError."""
        self.broker.current = f"health check {label}"
        client = Client(self.broker)
        client.handshake()
        client.open_channel(1)
        client.call(1, m.ConfirmSelect(), m.ConfirmSelectOk)
        declared = client.call(1, m.QueueDeclare(queue="", exclusive=True), m.QueueDeclareOk)
        body = f"healthy {label}".encode()
        client.publish(1, declared.queue, body)
        assert client.expect(1, m.BasicAck).delivery_tag == 1
        client.call(1, m.BasicGet(queue=declared.queue, no_ack=True), m.BasicGetOk)
        got = client.content()[1]
        assert got == body, (got, body)
        client.call(0, m.ConnectionClose(reply_code=200, reply_text="ok"), m.ConnectionCloseOk)
        client.close()


def _buffered(conn: Connection) -> bool:
    return conn.reader.buffered > 0


@pytest.fixture(scope="module")
def harness(tmp_path_factory):
    """One broker for the module's fuzz runs."""
    with inline_broker(tmp_path_factory.mktemp("fuzz") / "data", quiet=True) as broker:
        yield Harness(broker)


@pytest.fixture
def fresh_harness(tmp_path):
    """A broker of its own, for a regression case that may break it."""
    with inline_broker(tmp_path / "data", quiet=True) as broker:
        yield Harness(broker)


def run_fuzz(harness: Harness, seeds: list[int]) -> None:
    failures: list[tuple[int, list[str]]] = []
    unhealthy: list[str] = []
    ran = []

    def fuzz() -> None:
        harness.healthy_roundtrip("before")
        checked = seeds[0] if seeds else 0
        for n, seed in enumerate(seeds, 1):
            problems = harness.run_case(make_case(seed))
            ran.append(seed)
            if problems:
                failures.append((seed, problems))
            # After a failing case, and every HEALTH_EVERY cases, a healthy client
            # must still get its work done; a broken broker ends the run.
            if problems or n % HEALTH_EVERY == 0 or n == len(seeds):
                try:
                    harness.healthy_roundtrip(f"after seed {seed}")
                except (AssertionError, TimeoutError) as error:
                    unhealthy.append(f"after seeds {checked}..{seed}: {error!r}")
                    return
                checked = seed + 1
            if len(failures) >= 100:
                return

    started = time.monotonic()
    fuzz()
    elapsed = time.monotonic() - started
    print(f"\nfuzz: {len(ran)} of {len(seeds)} in-process cases from seed "
          f"{seeds[0] if seeds else '-'} in {elapsed:.1f}s "
          f"({len(ran) / max(elapsed, 1e-9):.0f}/s); "
          f"{len(failures)} failing cases; {harness.notes} notes (confirms sent behind a "
          f"connection.close)")
    for seed, problems in failures[:20]:
        case = make_case(seed)
        print(f"FAILING CASE (replay: WARREN_FUZZ_SEED={seed}): {case.describe()}")
        for problem in problems[:3]:
            print("    " + problem.replace("\n", "\n    "))
    assert not failures and not unhealthy, (
        f"{len(failures)} failing cases, seeds {[s for s, _ in failures[:50]]} (replay with "
        f"WARREN_FUZZ_SEED=...)" + (f"; then the broker became unhealthy {unhealthy}"
                                     if unhealthy else ""))


def test_fuzz_connection_state_machine(harness):
    run_fuzz(harness, case_seeds(3000))


@pytest.mark.soak
def test_fuzz_connection_state_machine_soak(harness):
    run_fuzz(harness, case_seeds(100_000, default_base=None))


# -- regression cases: what the fuzzer found, with its bytes ----------------------------


def _handshake() -> bytes:
    """A client's protocol header, handshake and channel 1, as a fuzz case starts."""
    return (frames.PROTOCOL_HEADER
            + frames.method_frame(0, m.ConnectionStartOk(
                client_properties={"capabilities": {}}, mechanism="PLAIN",
                response=b"\0guest\0guest", locale="en_US"))
            + frames.method_frame(0, m.ConnectionTuneOk(channel_max=2047, frame_max=131072,
                                                        heartbeat=0))
            + frames.method_frame(0, m.ConnectionOpen(virtual_host="/"))
            + frames.method_frame(1, m.ChannelOpen()))


def _declared_and_parked(queue: str) -> bytes:
    """Declare a queue, then declare it again: the second declare waits for the
    shard's answer, so what follows is parked in the channel's backlog."""
    return (frames.method_frame(1, m.QueueDeclare(queue=queue))
            + frames.method_frame(1, m.QueueDeclare(queue=queue, passive=True)))


def _publish(routing_key: str, properties: bytes, body: bytes) -> bytes:
    return (frames.method_frame(1, m.BasicPublish(exchange="", routing_key=routing_key))
            + struct.pack(">BHIHHQ", frames.FRAME_HEADER, 1, 12 + len(properties), 60, 0,
                          len(body)) + properties + b"\xce"
            + struct.pack(">BHI", frames.FRAME_BODY, 1, len(body)) + body + b"\xce")


def run_regression(harness: Harness, data: bytes):
    """Run `data` as one fuzz case: no problems, and a healthy broker after it.
    Returns what the broker wrote (a Verdict)."""
    problems = harness.run_case(Case(0, data, []))
    assert not problems, "\n".join(problems)
    harness.healthy_roundtrip("after the regression case")
    return harness.last_verdict


# A method frame with a 2-byte payload on channel 1 (too short for class-id + method-id).
TINY_METHOD_FRAME = bytes.fromhex("01 0001 00000002 0032 ce")
# A content header frame with a 4-byte payload (class-id and weight, no body size).
SHORT_CONTENT_HEADER = bytes.fromhex("02 0001 00000004 003c 0000 ce")


def test_regression_tiny_method_frame_behind_queue_declare(fresh_harness):
    """Issue 17.1, fuzz seed 17000339: replaying a parked channel's backlog raised FrameError out
    of ShardLink._read_events, which lost the shard's other events and never re-armed
    its doorbell: every channel waiting on that shard waited for ever."""
    verdict = run_regression(fresh_harness, _handshake() + _declared_and_parked("r-tiny")
                             + TINY_METHOD_FRAME)
    assert verdict.connection_close.reply_code == 501  # as without the declare in front


def test_regression_short_content_header_behind_queue_declare(fresh_harness):
    """Issue 17.1, fuzz seed 18000188 (found with 17.1 patched out): the same escape through
    frames.parse_content_header, for a content header frame too short to parse."""
    publish = frames.method_frame(1, m.BasicPublish(exchange="", routing_key="r-header"))
    verdict = run_regression(fresh_harness, _handshake() + _declared_and_parked("r-header")
                             + publish + SHORT_CONTENT_HEADER)
    assert verdict.connection_close.reply_code == 501  # as without the declare in front


def test_short_frames_without_a_parked_channel_close_with_frame_error(fresh_harness):
    """The same frames without the declare in front: 501, the reference for the above."""
    for tail in (TINY_METHOD_FRAME,
                 frames.method_frame(1, m.BasicPublish(exchange="", routing_key="q"))
                 + SHORT_CONTENT_HEADER):
        verdict = run_regression(fresh_harness, _handshake() + tail)
        assert verdict.connection_close.reply_code == 501


@pytest.mark.parametrize("properties", [b"\x10\x00", b"\x00\x01"],
                         ids=["delivery-mode-missing", "flag-word-missing"])
def test_regression_truncated_properties_on_a_routed_publish(fresh_harness, properties):
    """Properties that flag delivery-mode but end before it: peek_delivery_mode raised
    PropertiesError out of data_received (a real transport then aborted the
    connection without connection.close), after the confirm sequence number was taken.
    Seed 30048638 found the other way: a flag word that says another follows, and none.
    Since main's safety net it is a logged internal error closing with 541, but
    malformed properties are the client's error, as the expiration / priority /
    headers path (_read_extras) answers them: 502 SYNTAX_ERROR."""
    verdict = run_regression(fresh_harness, _handshake()
                             + frames.method_frame(1, m.ConfirmSelect())
                             + frames.method_frame(1, m.QueueDeclare(queue="r-props"))
                             + _publish("r-props", properties, b"x"))
    assert verdict.connection_close is not None or verdict.has(m.ChannelClose)
    assert verdict.connection_close is None or verdict.connection_close.reply_code != 541


@pytest.mark.parametrize("response", [b"", b"\0guest\0guest"], ids=["empty", "valid"])
def test_regression_start_ok_on_an_open_connection(fresh_harness, response):
    """A connection.start-ok after connection.open-ok was taken as a new login: with
    bad credentials the broker hung up without connection.close, with good ones it
    sent connection.tune again and left the open state. RabbitMQ closes the
    connection (unexpected method in state running)."""
    verdict = run_regression(fresh_harness, _handshake() + frames.method_frame(
        0, m.ConnectionStartOk(mechanism="PLAIN", response=response, locale="en_US")))
    assert [type(x) for _, x in verdict.methods].count(m.ConnectionTune) == 1
    assert verdict.connection_close is not None
    assert verdict.connection_close.reply_code in spec.HARD_ERRORS


def test_regression_no_confirms_behind_connection_close(fresh_harness):
    """Fuzz seed 17000852 and others: a publish confirmed in the same turn as a hard
    error has its basic.ack written after the connection.close; after close only
    close-ok may follow (the client discards the rest)."""
    verdict = run_regression(fresh_harness, _handshake()
                             + frames.method_frame(1, m.ConfirmSelect())
                             + _publish("nowhere", b"\x00\x00", b"x")
                             + bytes.fromhex("01 0000 00000004 ffff 0001 ce"))  # unknown method
    assert verdict.connection_close.reply_code == 503
    assert not verdict.notes, verdict.notes


def test_regression_unsolicited_close_ok(fresh_harness):
    """A connection.close-ok the broker never asked for (no connection.close was sent)
    on an open connection: the broker hangs up without a word. Every other protocol
    error gets a connection.close with its reply code first."""
    verdict = run_regression(fresh_harness, _handshake()
                             + bytes.fromhex("01 0000 00000004 000a 0033 ce"))  # close-ok
    assert verdict.connection_close is not None


def test_regression_inequivalent_argument_not_utf8(fresh_harness):
    """Redeclaring a queue with a longstr argument that is not valid UTF-8: the 406
    text decoded it (arguments._describe) and raised UnicodeDecodeError, a 541
    internal error instead of 406 PRECONDITION_FAILED 'inequivalent arg'."""
    verdict = run_regression(fresh_harness, _handshake()
                             + frames.method_frame(1, m.QueueDeclare(
                                 queue="r-args", arguments={"x-message-ttl": 1000}))
                             + frames.method_frame(1, m.QueueDeclare(
                                 queue="r-args", arguments={"x-message-ttl": b"\xf5\xff"})))
    assert [x.reply_code for _, x in verdict.methods if type(x) is m.ChannelClose] == [406]
