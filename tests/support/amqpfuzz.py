"""A seeded mutation fuzzer over AMQP 0-9-1 client byte streams (issue 17).

`make_case(seed)` builds a valid client conversation with the project's own codec
(handshake, channels, declares, binds, publishes with content, consumes, gets,
acks, confirms, transactions, closes), then mutates it at the frame level (drop,
duplicate, reorder, corrupt sizes, end octets, channels and types, truncate or
pad payloads, insert random frames, a tiny method frame right behind a
queue.declare) and at the byte level (flip, truncate, insert, splice). The same
seed always gives the same bytes, so a failing case is replayed from its seed.

`check_output(written)` judges what the broker wrote back: well-formed frames,
decodable methods, and connection.close / channel.close with reply codes the
spec defines and texts that start with the code's name.

The in-process test (test_fuzz_connection.py) and the TCP test (test_fuzz_tcp.py)
share both. Counts and seeds come from environment variables so that CI runs a
few thousand cases and `-m soak` many more:

    WARREN_FUZZ_CASES       in-process cases (CI default 3000; soak 100000)
    WARREN_FUZZ_TCP_CASES   TCP cases (CI default 300; soak 5000)
    WARREN_FUZZ_BASE_SEED   first case seed (default 17000000; soak: random)
    WARREN_FUZZ_SEED        replay this one case seed (both tests)
"""

from __future__ import annotations

import os
import random
import struct
from dataclasses import dataclass, field

from warren.gateway.amqp import frames, spec
from warren.gateway.amqp import methods as m
from warren.gateway.amqp.fieldtable import encode_table
from warren.gateway.amqp.frames import FrameError, FrameReader
from warren.gateway.amqp.properties import BasicProperties, encode_properties

FRAME_END = b"\xce"
_prefix = struct.Struct(">BHI")
BASIC = spec.CLASS_IDS["basic"]

# Small pools of names, so that cases meet each other's queues and exchanges.
QUEUES = ("fuzz-a", "fuzz-b", "fuzz-c")
DURABLE_QUEUE = "fuzz-durable"
EXCHANGES = ("fuzz-x", "fuzz-topic", "amq.direct", "amq.fanout", "amq.topic", "amq.headers")
EXCHANGE_TYPES = ("direct", "fanout", "topic", "headers", "x-bogus")
CAPABILITIES = {"publisher_confirms": True, "basic.nack": True, "consumer_cancel_notify": True,
                "connection.blocked": True, "authentication_failure_close": True}


def env_int(name: str, default: int) -> int:
    value = os.environ.get(name, "")
    return int(value) if value.strip() else default


def case_seeds(default_count: int, default_base: int | None = 17_000_000,
               count_var: str = "WARREN_FUZZ_CASES") -> list[int]:
    """The case seeds to run: WARREN_FUZZ_SEED alone, or a run of consecutive seeds
    from WARREN_FUZZ_BASE_SEED (a random base when the default is None)."""
    replay = os.environ.get("WARREN_FUZZ_SEED", "").strip()
    if replay:
        return [int(s) for s in replay.split(",")]
    base = env_int("WARREN_FUZZ_BASE_SEED",
                   default_base if default_base is not None else random.randrange(10**9))
    return list(range(base, base + env_int(count_var, default_count)))


def frame(frame_type: int, channel: int, payload: bytes) -> bytes:
    return _prefix.pack(frame_type, channel, len(payload)) + payload + FRAME_END


def method_frame(channel: int, method: m.Method) -> bytes:
    return frames.method_frame(channel, method)


@dataclass
class Case:
    seed: int
    data: bytes
    chunks: list[int]  # split points: data is fed in these pieces
    mutations: list[str] = field(default_factory=list)
    kinds: list[str] = field(default_factory=list)  # what each frame was, before byte mutations

    def describe(self) -> str:
        return (f"seed {self.seed}: mutations {self.mutations}; frames {self.kinds}; "
                f"{len(self.data)} bytes {self.data[:400].hex()}"
                f"{'...' if len(self.data) > 400 else ''}")

    def pieces(self) -> list[bytes]:
        edges = [0, *self.chunks, len(self.data)]
        return [self.data[a:b] for a, b in zip(edges, edges[1:]) if b > a]


# -- valid conversations ---------------------------------------------------------


class _Conversation:
    """Builds the frames of one valid client conversation, each with a label."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.frames: list[bytes] = []
        self.kinds: list[str] = []
        self.frame_max = 131072
        self.channels: list[int] = []
        self.consumer_tags: dict[int, list[str]] = {}

    def add(self, kind: str, data: bytes) -> None:
        self.frames.append(data)
        self.kinds.append(kind)

    def method(self, channel: int, method: m.Method) -> None:
        self.add(method.NAME, method_frame(channel, method))

    def handshake(self) -> None:
        rng = self.rng
        self.add("protocol-header", frames.PROTOCOL_HEADER)
        caps = rng.choice([{}, CAPABILITIES, {"connection.blocked": True}])
        if rng.random() < 0.8:
            mechanism, response = "PLAIN", b"\0guest\0guest"
        elif rng.random() < 0.7:
            table = encode_table({"LOGIN": "guest", "PASSWORD": "guest"})
            mechanism, response = "AMQPLAIN", table[4:]
        else:
            mechanism, response = "PLAIN", b"\0guest\0wrong"
        self.method(0, m.ConnectionStartOk(
            client_properties={"product": "amqpfuzz", "capabilities": caps},
            mechanism=mechanism, response=response, locale="en_US"))
        # (0, "no limit", is more than the broker offers: RabbitMQ refuses it)
        self.frame_max = rng.choice([4096, 131072])
        self.method(0, m.ConnectionTuneOk(channel_max=rng.choice([16, 2047]),
                                          frame_max=self.frame_max,
                                          heartbeat=rng.choice([0, 0, 60])))
        self.method(0, m.ConnectionOpen(virtual_host=rng.choice(["/"] * 9 + ["nowhere"])))

    def open_channel(self) -> int:
        number = max(self.channels, default=0) + 1
        self.method(number, m.ChannelOpen())
        self.channels.append(number)
        return number

    def queue(self) -> str:
        rng = self.rng
        return rng.choice(QUEUES + ("", rng.choice(QUEUES) + "-x"))

    def publish(self, channel: int) -> None:
        rng = self.rng
        if rng.random() < 0.6:
            exchange, key = "", rng.choice(QUEUES + (DURABLE_QUEUE, "nowhere"))
        else:
            exchange, key = rng.choice(EXCHANGES), rng.choice(("k", "a.b", "", "#"))
        publish = m.BasicPublish(exchange=exchange, routing_key=key,
                                 mandatory=rng.random() < 0.3)
        props = {}
        if rng.random() < 0.5:
            props["delivery_mode"] = rng.choice([1, 2])
        if rng.random() < 0.2:
            props["headers"] = {"h": rng.randint(0, 5), "s": "x" * rng.randint(0, 20)}
        if rng.random() < 0.1:
            props["expiration"] = rng.choice(["0", "10", "60000", "-1", "x"])
        if rng.random() < 0.1:
            props["priority"] = rng.randint(0, 255)
        if rng.random() < 0.05:
            props["reply_to"] = rng.choice(["amq.rabbitmq.reply-to", "somewhere"])
        properties = encode_properties(BasicProperties(**props))
        body = rng.randbytes(rng.choice([0, 1, 10, 200, 5000, 20000]))
        self.method(channel, publish)
        self.add("content-header", frame(frames.FRAME_HEADER, channel,
                                         struct.pack(">HHQ", BASIC, 0, len(body)) + properties))
        chunk = self.frame_max - frames.FRAME_OVERHEAD
        for start in range(0, len(body), chunk):
            self.add("content-body", frame(frames.FRAME_BODY, channel, body[start:start + chunk]))

    def operation(self) -> None:
        rng = self.rng
        ch = rng.choice(self.channels)
        op = rng.choices(
            ["declare", "declare-twice", "publish", "get", "consume", "cancel", "ack", "qos",
             "confirm", "tx", "exchange", "bind", "purge", "delete", "flow", "recover",
             "heartbeat", "channel-cycle", "access"],
            weights=[10, 8, 20, 8, 6, 3, 6, 3, 6, 3, 4, 4, 2, 2, 2, 2, 2, 3, 1])[0]
        if op in ("declare", "declare-twice"):
            durable = rng.random() < 0.03
            name = DURABLE_QUEUE if durable else self.queue()
            args = rng.choice([{}, {}, {}, {"x-max-length": 5}, {"x-message-ttl": 1000},
                               {"x-queue-type": "quorum"}, {"x-bogus": 1},
                               {"x-max-priority": 3}])
            declare = m.QueueDeclare(queue=name, durable=durable,
                                     passive=rng.random() < 0.1,
                                     exclusive=not durable and rng.random() < 0.3,
                                     auto_delete=rng.random() < 0.1,
                                     nowait=rng.random() < 0.1, arguments=args)
            self.method(ch, declare)
            if op == "declare-twice":  # the second one finds it: a shard round trip
                self.method(ch, m.QueueDeclare(queue=name, durable=durable, passive=True))
        elif op == "publish":
            for _ in range(rng.choice([1, 1, 2, 5])):
                self.publish(ch)
        elif op == "get":
            self.method(ch, m.BasicGet(queue=self.queue(), no_ack=rng.random() < 0.5))
        elif op == "consume":
            tag = rng.choice(["", "c1", "c2"])
            self.method(ch, m.BasicConsume(queue=self.queue(), consumer_tag=tag,
                                           no_ack=rng.random() < 0.5,
                                           exclusive=rng.random() < 0.1,
                                           nowait=rng.random() < 0.1))
            self.consumer_tags.setdefault(ch, []).append(tag or "amq.ctag-x")
        elif op == "cancel":
            tags = self.consumer_tags.get(ch) or ["c1"]
            self.method(ch, m.BasicCancel(consumer_tag=rng.choice(tags),
                                          nowait=rng.random() < 0.2))
        elif op == "ack":
            kind = rng.choice([m.BasicAck, m.BasicNack, m.BasicReject])
            tag = rng.choice([0, 1, 2, 3, 100])
            if kind is m.BasicAck:
                self.method(ch, m.BasicAck(delivery_tag=tag, multiple=rng.random() < 0.5))
            elif kind is m.BasicNack:
                self.method(ch, m.BasicNack(delivery_tag=tag, multiple=rng.random() < 0.5,
                                            requeue=rng.random() < 0.5))
            else:
                self.method(ch, m.BasicReject(delivery_tag=tag, requeue=rng.random() < 0.5))
        elif op == "qos":
            self.method(ch, m.BasicQos(prefetch_count=rng.choice([0, 1, 10]),
                                       global_=rng.random() < 0.5,
                                       prefetch_size=rng.choice([0, 0, 0, 100])))
        elif op == "confirm":
            self.method(ch, m.ConfirmSelect(nowait=rng.random() < 0.3))
        elif op == "tx":
            self.method(ch, rng.choice([m.TxSelect(), m.TxCommit(), m.TxRollback()]))
        elif op == "exchange":
            self.method(ch, m.ExchangeDeclare(exchange=rng.choice(EXCHANGES),
                                              type=rng.choice(EXCHANGE_TYPES),
                                              passive=rng.random() < 0.1,
                                              auto_delete=rng.random() < 0.1,
                                              nowait=rng.random() < 0.1))
        elif op == "bind":
            kind = rng.choice([m.QueueBind, m.QueueUnbind])
            self.method(ch, kind(queue=self.queue(), exchange=rng.choice(EXCHANGES),
                                 routing_key=rng.choice(("k", "a.*", "#", ""))))
        elif op == "purge":
            self.method(ch, m.QueuePurge(queue=self.queue(), nowait=rng.random() < 0.2))
        elif op == "delete":
            self.method(ch, m.QueueDelete(queue=self.queue(), if_unused=rng.random() < 0.3,
                                          if_empty=rng.random() < 0.3))
        elif op == "flow":
            self.method(ch, m.ChannelFlow(active=rng.random() < 0.5))
        elif op == "recover":
            self.method(ch, rng.choice([m.BasicRecover(requeue=True), m.BasicRecoverAsync()]))
        elif op == "heartbeat":
            self.add("heartbeat", frames.HEARTBEAT_FRAME)
        elif op == "channel-cycle":
            self.method(ch, m.ChannelClose(reply_code=200, reply_text="bye"))
            self.channels.remove(ch)
            self.open_channel()
        elif op == "access":
            self.method(ch, m.AccessRequest(realm="/data"))


def valid_conversation(rng: random.Random) -> _Conversation:
    conv = _Conversation(rng)
    conv.handshake()
    for _ in range(rng.choice([1, 1, 2, 3])):
        conv.open_channel()
    for _ in range(rng.randint(0, 12)):
        conv.operation()
    ending = rng.random()
    if ending < 0.15:
        conv.method(0, m.ConnectionClose(reply_code=200, reply_text="bye"))
    elif ending < 0.25 and conv.channels:
        conv.method(conv.channels[0], m.ChannelClose(reply_code=200, reply_text="bye"))
    return conv


# -- mutations ---------------------------------------------------------------------


_ALL_METHODS = sorted(m.BY_ID.values(), key=lambda c: (c.CLASS_ID, c.METHOD_ID))


def tiny_method_payload(rng: random.Random) -> bytes:
    """A method frame payload too short to hold class-id and method-id."""
    return rng.randbytes(rng.choice([0, 1, 2, 2, 2, 3]))


def random_frame(rng: random.Random, channels: list[int]) -> tuple[str, bytes]:
    frame_type = rng.choice([1, 1, 1, 2, 3, 8, rng.randrange(256)])
    channel = rng.choice([0, 0, *channels, *channels, 65535, rng.randrange(65536)])
    style = rng.randrange(6)
    if style == 0:
        payload = tiny_method_payload(rng)
    elif style == 1:
        payload = rng.randbytes(rng.randrange(64))
    elif style == 2:  # any method of the spec, server-side ones too, default arguments
        payload = m.encode_method(rng.choice(_ALL_METHODS)())
    elif style == 3:  # a known method id with garbage arguments
        cls = rng.choice(_ALL_METHODS)
        payload = struct.pack(">HH", cls.CLASS_ID, cls.METHOD_ID) + rng.randbytes(
            rng.randrange(24))
    elif style == 4:  # a content header announcing some size
        payload = struct.pack(">HHQ", rng.choice([BASIC, BASIC, 10, 0]), 0,
                              rng.choice([0, 1, 5, 2**63, 2**64 - 1])) + rng.choice(
                                  [b"\x00\x00", b"\x10\x00\x02", b"\xff\xff", b""])
    else:
        payload = b""
    return f"random(type {frame_type}, ch {channel}, {payload[:12].hex()})", frame(
        frame_type, channel, payload)


def _with_payload(data: bytes, payload: bytes) -> bytes:
    return data[:1] + data[1:3] + struct.pack(">I", len(payload)) + payload + FRAME_END


def mutate_frames(rng: random.Random, conv: _Conversation, mutations: list[str]) -> None:
    fs, kinds = conv.frames, conv.kinds
    if not fs:
        return
    op = rng.choices(
        ["drop", "duplicate", "swap", "move", "insert", "tiny-after-declare", "size",
         "end-octet", "channel", "type", "short-payload", "long-payload", "other-method"],
        weights=[8, 8, 6, 4, 12, 10, 8, 4, 6, 4, 8, 6, 6])[0]
    i = rng.randrange(len(fs))
    is_frame = i > 0 or kinds[0] != "protocol-header"
    if op == "drop":
        del fs[i], kinds[i]
    elif op == "duplicate":
        j = rng.choice([i + 1, rng.randrange(len(fs) + 1)])
        fs.insert(j, fs[i])
        kinds.insert(j, kinds[i])
    elif op == "swap":
        j = min(i + 1, len(fs) - 1) if rng.random() < 0.6 else rng.randrange(len(fs))
        fs[i], fs[j] = fs[j], fs[i]
        kinds[i], kinds[j] = kinds[j], kinds[i]
    elif op == "move":
        f, k = fs.pop(i), kinds.pop(i)
        j = rng.randrange(len(fs) + 1)
        fs.insert(j, f)
        kinds.insert(j, k)
    elif op == "insert":
        kind, data = random_frame(rng, conv.channels or [1])
        j = rng.randrange(1, len(fs) + 1) if len(fs) > 1 else len(fs)
        fs.insert(j, data)
        kinds.insert(j, kind)
        op = f"insert {kind}"
    elif op == "tiny-after-declare":
        declares = [j for j, k in enumerate(kinds) if k.startswith("queue.")] or [
            j for j, k in enumerate(kinds) if k not in ("protocol-header",)] or [0]
        j = rng.choice(declares)
        channel = struct.unpack_from(">H", fs[j], 1)[0] if len(fs[j]) >= 3 and j else 1
        payload = tiny_method_payload(rng)
        fs.insert(j + 1, frame(frames.FRAME_METHOD, channel, payload))
        kinds.insert(j + 1, f"tiny-method({payload.hex()})")
        op = f"tiny-after {kinds[j]}"
    elif not is_frame or len(fs[i]) < 8:
        op = f"{op} (skipped: not a frame)"
    elif op == "size":
        size = len(fs[i]) - 8
        new = rng.choice([0, 1, 3, size - 1, size + 1, size + 7, 131072, 131073, 2**31,
                          2**32 - 1, rng.randrange(2**32)])
        fs[i] = fs[i][:3] + struct.pack(">I", max(new, 0)) + fs[i][7:]
        op = f"size {size}->{new} of frame {i}"
    elif op == "end-octet":
        fs[i] = fs[i][:-1] + bytes((rng.randrange(256),))
    elif op == "channel":
        channel = rng.choice([0, 1, 2, 3, 4, 2047, 2048, 65535])
        fs[i] = fs[i][:1] + struct.pack(">H", channel) + fs[i][3:]
        op = f"channel->{channel} of frame {i}"
    elif op == "type":
        fs[i] = bytes((rng.choice([1, 2, 3, 4, 8, 0, 255]),)) + fs[i][1:]
    elif op == "short-payload":
        payload = fs[i][7:-1]
        fs[i] = _with_payload(fs[i], payload[:rng.randrange(len(payload) + 1)])
    elif op == "long-payload":
        fs[i] = _with_payload(fs[i], fs[i][7:-1] + rng.randbytes(rng.randint(1, 9)))
    elif op == "other-method":
        fs[i] = _with_payload(fs[i], m.encode_method(rng.choice(_ALL_METHODS)()))
    if not op.startswith(("insert ", "tiny-after ", "size ", "channel->")):
        op = f"{op} frame {i}"
    mutations.append(op)


def mutate_bytes(rng: random.Random, data: bytes, mutations: list[str]) -> bytes:
    if not data:
        return data
    op = rng.choice(["flip", "flip", "byte", "truncate", "insert", "splice"])
    buf = bytearray(data)
    i = rng.randrange(len(buf))
    if op == "flip":
        buf[i] ^= 1 << rng.randrange(8)
    elif op == "byte":
        buf[i] = rng.choice([0, 0xFF, 0xCE, 1, 2, 3, 8, rng.randrange(256)])
    elif op == "truncate":
        del buf[i:]
    elif op == "insert":
        buf[i:i] = rng.randbytes(rng.randint(1, 8))
    else:
        j = rng.randrange(i, min(len(buf), i + 64) + 1)
        buf[i:i] = buf[i:j]
    mutations.append(f"{op}@{i}")
    return bytes(buf)


def make_case(seed: int) -> Case:
    rng = random.Random(seed)
    conv = valid_conversation(rng)
    mutations: list[str] = []
    # roll < 0.06: a valid conversation (now and then, to keep the happy paths honest);
    # below 0.75 frame mutations, from 0.5 up byte mutations.
    roll = rng.random()
    frame_mutations = rng.choice([1, 1, 1, 2, 3]) if roll >= 0.06 else 0
    if roll < 0.75:
        for _ in range(frame_mutations):
            mutate_frames(rng, conv, mutations)
    data = b"".join(conv.frames)
    if roll >= 0.5:
        for _ in range(rng.choice([1, 1, 2, 4])):
            data = mutate_bytes(rng, data, mutations)
    chunks: list[int] = []
    if data and rng.random() < 0.5:  # feed in pieces: the reader must buffer correctly
        chunks = sorted(rng.sample(range(1, len(data) + 1), min(len(data),
                                                                 rng.choice([1, 2, 5, 20]))))
    return Case(seed, data, chunks, mutations, list(conv.kinds))


# -- judging what the broker wrote -----------------------------------------------------


@dataclass
class Verdict:
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # odd but harmless, counted and reported
    methods: list[tuple[int, m.Method]] = field(default_factory=list)
    rejected_header: bool = False  # the broker answered with its protocol header
    partial: bool = False  # the output ends inside a frame

    @property
    def connection_close(self) -> m.ConnectionClose | None:
        return next((x for _, x in self.methods if type(x) is m.ConnectionClose), None)

    def has(self, kind: type) -> bool:
        return any(type(x) is kind for _, x in self.methods)

    def hang_up_explained(self) -> bool:
        """Whether a hang-up after this output is in order: the broker refused the
        protocol header, sent connection.close, answered the client's close, or
        hung up on a handshake error (before tune-ok, as RabbitMQ, without a word:
        a refused login, a bad start-ok or tune-ok; the output cannot tell an error
        after tune-ok, which gets connection.close, from one before it)."""
        handshake_error = self.has(m.ConnectionStart) and not self.has(m.ConnectionOpenOk)
        return (self.rejected_header or self.connection_close is not None
                or self.has(m.ConnectionCloseOk) or handshake_error)


def check_output(written: bytes) -> Verdict:
    verdict = Verdict()
    if written.startswith(frames.PROTOCOL_HEADER):
        verdict.rejected_header = True
        if len(written) != len(frames.PROTOCOL_HEADER):
            verdict.problems.append(f"bytes after the protocol header: {written[8:40].hex()}")
        return verdict
    reader = FrameReader(1 << 30)
    reader.receive_data(written)
    closed_at = None
    while True:
        try:
            got = reader.next_frame()
        except FrameError as error:
            verdict.problems.append(f"malformed frame from the broker: {error.text}")
            return verdict
        if got is None:
            break
        frame_type, channel, payload = got
        if frame_type == frames.FRAME_HEARTBEAT:
            continue
        if frame_type not in (frames.FRAME_METHOD, frames.FRAME_HEADER, frames.FRAME_BODY):
            verdict.problems.append(f"frame of type {frame_type} from the broker")
            continue
        if frame_type != frames.FRAME_METHOD:
            if closed_at is not None:
                verdict.problems.append("content frame after connection.close")
            continue
        try:
            method = m.decode_method(payload)
        except m.CodecError as error:
            verdict.problems.append(f"undecodable method from the broker: {error}")
            continue
        verdict.methods.append((channel, method))
        if closed_at is not None and type(method) is not m.ConnectionCloseOk:
            # Confirms owed at the moment of a hard error still go out behind the
            # connection.close (the client discards them, AMQP 0-9-1 connection.close):
            # a note, and tests/session/test_fuzz_connection.py keeps a regression test on it.
            to = (verdict.notes if type(method) in (m.BasicAck, m.BasicNack)
                  else verdict.problems)
            to.append(f"{method.NAME} on channel {channel} after connection.close")
        if type(method) in (m.ConnectionClose, m.ChannelClose):
            code = method.reply_code
            name = spec.REPLY_NAMES.get(code)
            if name is None or code == spec.REPLY_SUCCESS:
                verdict.problems.append(f"{method.NAME} with reply code {code} not in the spec")
            elif not method.reply_text.startswith(name):
                verdict.problems.append(f"{method.NAME} {code}: text {method.reply_text!r}")
            if type(method) is m.ConnectionClose:
                if channel != 0:
                    verdict.problems.append(f"connection.close on channel {channel}")
                if closed_at is not None:
                    verdict.problems.append("a second connection.close")
                closed_at = len(verdict.methods)
            elif channel == 0:
                verdict.problems.append("channel.close on channel 0")
    verdict.partial = reader.buffered > 0
    return verdict
