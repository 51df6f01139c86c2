"""One client connection, sans-IO: bytes in, bytes out to an output port, timers
from a clock port. The asyncio protocol that reads the socket into it and hands
it the transport and the loop as those ports is io/protocol.py.

Handshake (protocol header, start/start-ok, tune/tune-ok, open: session/lifecycle.py),
heartbeats, channel multiplexing, connection-level errors and flow control. Output
for a loop turn is gathered and written with one call; confirms and credit grants
are flushed at the same moment.

Fairness: before handling input, the shards' waiting events (deliveries,
confirms, credit) are taken in; a connection handles at most FRAMES_PER_TURN
frames per loop turn (FRAMES_PER_SHARED_TURN while input of the other kind,
publishes or acks, comes in too) and then yields to everyone else. Reading
stops while the connection is held: out of credit towards a shard or a shard's
ring full (state `flow`), or a resource alarm (state `blocked`, with
connection.blocked): as RabbitMQ's reader, a connection is blocked when a
publish's content header is next while an alarm is on, and reads nothing more
(that header, nor what follows it) until every alarm clears.

Input: read straight into the frame reader's buffer (get_buffer, then
buffer_updated with the count), or handed over as bytes (receive).

Driven with no socket and no event loop (tests/support/session.py does, with a
Wire for output and a ManualClock): the Gateway it is given must run on that
clock too (its flush_soon and shard links), as the harness's does.

    conn = Connection(gateway)
    conn.start(output, clock, peer=("127.0.0.1", 40000), local=("127.0.0.1", 5672))
    conn.receive(frames.PROTOCOL_HEADER)     # handled at once
    clock.step()              # what it asked call_soon for: the gateway's flush,
                              # which writes connection.start to output
    conn.receive(frames.method_frame(0, m.ConnectionStartOk(...)))  # then tune-ok,
    ...                       # open, channel.open, publishes, as a client sends them
    clock.advance(3.0); clock.step()   # timers due by then (heartbeats, close-ok's)
    conn.connection_lost()    # the client hung up (a Wire says so after close)
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, Protocol

from ..amqp import frames, spec
from ..amqp import methods as m
from ..amqp.frames import FrameError, FrameReader
from ..errors import AMQPError
from ..logthrottle import log_client_error
from ..snapshots import ConnectionInfo
from . import lifecycle
from .assembly import decode_method
from .channel import Channel
from .lifecycle import (
    AWAIT_HEADER,
    AWAIT_START_OK,
    AWAIT_TUNE_OK,
    CLOSE_OK_TIMEOUT,
    CLOSED,
    CLOSING,
    HANDSHAKE_TIMEOUT,
    OPEN,
    operation,
)
from .ports import Hub

log = logging.getLogger("warren.connection")

# Frames one connection may handle per loop turn before yielding (a publish is
# three): small enough that deliveries and credit are not kept waiting behind a
# flood, large enough that a turn's work still goes out in big batches. A third
# of that when input of the other kind came in since the connection's last turn:
# publishes, for one whose last turn had acks or other commands, and those, for
# one whose last turn had publishes only. Each ack frees a delivery, and the
# round trip it waits through behind a flood bounds a manual-ack consumer; floods
# among themselves keep the larger budget, which costs less a message (measured:
# docs/architecture.md).
FRAMES_PER_TURN = 90
FRAMES_PER_SHARED_TURN = 30
ALARM = "alarm"  # why reading is held, beside the shard links that hold it
YIELD = "yield"



class Output(Protocol):
    """Where a connection's bytes go (an asyncio transport is one)."""

    def write(self, data: bytes) -> None: ...
    def writelines(self, parts: list) -> None: ...
    def close(self) -> None: ...  # after what was written; connection_lost follows
    def abort(self) -> None: ...
    def pause_reading(self) -> None: ...  # give it no input until resume_reading
    def resume_reading(self) -> None: ...


class Timer(Protocol):
    def cancel(self) -> None: ...


class Clock(Protocol):
    """The time and timers a connection asks for (an asyncio loop is one)."""

    def time(self) -> float: ...
    def call_later(self, delay: float, callback: Callable[..., Any], *args: Any) -> Timer: ...
    def call_soon(self, callback: Callable[..., Any], *args: Any) -> Any: ...


class Connection:
    # Given by start, before anything reaches the connection.
    output: Output
    clock: Clock

    def __init__(self, gateway: Hub):
        self.gateway = gateway
        self.id = gateway.new_id()  # broker-wide: owner of its exclusive queues
        config = gateway.config  # what connection.tune offers
        self.channel_max = config.channel_max
        self.frame_max = config.frame_max
        self.heartbeat = config.heartbeat
        self.state = AWAIT_HEADER
        # Until tune-ok, frames may be as large as the spec's minimum only, as on
        # RabbitMQ: a client not logged in cannot send a 128 KiB start-ok.
        self.reader = FrameReader(spec.FRAME_MIN_SIZE)
        # Room for a read in the reader's buffer: io/protocol.py gives the transport
        # this bound method itself, one Python frame less a read.
        self.get_buffer = self.reader.get_buffer
        self.channels: dict[int, Channel] = {}
        self.capabilities: dict = {}
        self.client_properties: dict = {}
        self.user = ""
        self.vhost = None
        self.owed_confirms: set[Channel] = set()
        self.owed_grants: set = set()
        self._out: list[bytes] = []
        self._writev = False  # _out holds a large body's pieces: writelines, not a join
        self._flush_scheduled = False
        self._writing_paused = False
        # Why reading is held: shard links (credit spent, ring full), ALARM, or YIELD
        # (this turn's share of input is used up; the rest waits in the reader).
        self.paused_by: set = set()
        # Its last input turn's kind (not publishes only), and how many turns of
        # the other kind the gateway had had by then (its budget: FRAMES_PER_TURN).
        self._commands = False
        self._other_kind_seen = 0
        # method payload -> publishing.Route: where its channels' publishes went (one
        # user, one vhost: a route holds for every channel of the connection)
        self.routes: dict = {}
        self.exclusive_queues: set = set()  # QueueMeta of the exclusive queues it owns
        # counted by gateway 0 (on another gateway): every connection that opened,
        # so the one that may declare, own exclusive queues and count against limits,
        # until gateway 0 is told it closed (follower.connection_closed)
        self.admitted = False
        # the read and write counts the last heartbeat tick saw (reads and writes are
        # counted, not timed: a clock call each would be on every message's path)
        self.reads_seen = self.writes_seen = 0
        self.quiet_ticks = 0  # heartbeat ticks in a row that saw nothing read
        self.timer: Timer | None = None
        self.received_any = False
        self.end_logged = False  # why it ended is logged: no plain "closing" line
        # socket traffic, as RabbitMQ's recv_oct/recv_cnt/send_oct/send_cnt
        self.recv_oct = self.recv_cnt = self.send_oct = self.send_cnt = 0

    def start(self, output: Output, clock: Clock, peer, local, tls: bool = False) -> None:
        """The client is connected (from `peer`, a (host, port) when known, to
        `local`): counted, and given HANDSHAKE_TIMEOUT to open."""
        self.output = output
        self.clock = clock
        self.connected_at = time.time()
        self.peer = peer
        self.local = local or ("?", 0)
        self.tls = tls
        peer = peer if isinstance(peer, tuple) else ("?", 0)
        self.name = f"{peer[0]}:{peer[1]} -> {self.local[0]}:{self.local[1]}"  # RabbitMQ's
        self.log_name = self.name  # with the client-provided name once known
        self.gateway.registry.connections.add(self)
        self.gateway.totals.connections_opened += 1
        self.timer = clock.call_later(HANDSHAKE_TIMEOUT, lifecycle.handshake_timeout, self)

    def connection_lost(self, exc: BaseException | None = None) -> None:
        """The client hung up, or the output closed after close or abort."""
        lifecycle.log_end(self)
        self.state = CLOSED
        if self.timer is not None:
            self.timer.cancel()
        lifecycle.let_go(self)
        self.gateway.registry.connections.discard(self)
        self.gateway.totals.connections_closed += 1
        for link in self.gateway.shards:
            link.forget(self)

    def buffer_updated(self, nbytes: int) -> None:
        # The transport holds the buffer until this returns: the reader is not
        # resized here (nor by what handles the frames).
        if self.state == CLOSED:  # lingering after close-ok: dropped
            return
        self.reader.buffer_updated(nbytes)
        if not self.received_any:  # RabbitMQ logs a connection once it sends something
            self.received_any = True
            log.info("accepting AMQP connection (%s)", self.name, extra=self.log_fields())
        self.recv_oct += nbytes
        self.recv_cnt += 1
        self._handle_input()

    def receive(self, data: bytes) -> None:
        """Bytes handed over (a TLS handshake's early bytes, a test): taken in as a
        read is."""
        room = self.reader.get_buffer(len(data))
        room[:len(data)] = data
        room.release()
        self.buffer_updated(len(data))

    def _handle_input(self) -> None:
        """Handle this turn's share of the buffered frames, after the shards' events
        (taken in and written out first); what it produces goes to the shards at once,
        so a consumer's acks are not a loop turn late."""
        gateway = self.gateway
        gateway.take_shard_events()
        turns = gateway.turns_by_kind
        budget = (FRAMES_PER_TURN if turns[not self._commands] == self._other_kind_seen
                  else FRAMES_PER_SHARED_TURN)
        commands = published = False
        alarms = gateway.alarms
        try:
            if self.state == AWAIT_HEADER and not lifecycle.read_protocol_header(self):
                return
            reader = self.reader
            while self.state != CLOSED and not self.paused_by:
                # Under an alarm frame by frame, to stop before a content header.
                publish = None if alarms.active else reader.next_publish()
                if publish is not None:  # three frames (or two) in one pass
                    self._handle_publish(*publish)
                    budget -= 3
                    published = True
                else:
                    if (alarms.active and self.state == OPEN
                            and frames.next_frame_type(reader) == frames.FRAME_HEADER):
                        self._block(alarms.reason())
                        break
                    frame = reader.next_frame()
                    if frame is None:
                        break
                    self._handle_frame(*frame)
                    budget -= 1
                    commands = True
                if budget <= 0:
                    self.hold(YIELD)
                    self.clock.call_soon(self._next_turn)
                    break
        except FrameError as error:
            self.close_with_error(AMQPError(spec.FRAME_ERROR, error.text))
        except AMQPError as error:
            self.close_with_error(error)
        except Exception as error:
            self.fail(error)
        finally:
            if commands or published:
                turns[commands] += 1
                self._commands = commands
            self._other_kind_seen = turns[not self._commands]
            gateway.shards.send()
            gateway.take_answers()

    def pause_writing(self) -> None:
        """The output's buffer is full: credit is granted again once it drains."""
        self._writing_paused = True

    def resume_writing(self) -> None:
        self._writing_paused = False
        self._grant_credit()

    # -- output ----------------------------------------------------------------

    def send(self, data: bytes) -> None:
        if self.state >= CLOSING:  # after connection.close only the closing methods go out
            return
        self._out.append(data)
        if not self._flush_scheduled:  # schedule_flush, without its frame (every delivery)
            self._flush_scheduled = True
            self.gateway.flush_soon(self)

    def send_uncopied(self, parts: list) -> None:
        """Like send, for pieces that go out back to back by writev, never joined:
        a large body's frames."""
        if self.state >= CLOSING:
            return
        self._out += parts
        self._writev = True
        self.schedule_flush()

    def send_closing(self, method) -> None:
        """connection.close or close-ok, which alone may follow a connection.close."""
        if self.state != CLOSED:
            self._out.append(frames.method_frame(0, method))
            self.schedule_flush()

    def schedule_flush(self) -> None:
        """Write this turn's output (and owed confirms and credit) at the end of the
        turn, or sooner: when the shards' events that produced it are all in."""
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.gateway.flush_soon(self)

    def flush(self) -> None:
        if self.owed_confirms:  # their acks join this write (no second flush for them)
            self._flush_scheduled = True
            owed, self.owed_confirms = self.owed_confirms, set()
            for channel in owed:
                channel.send_confirms()
        self._flush_scheduled = False
        if self._out and self.state != CLOSED:
            out, self._out = self._out, []
            if self._writev:
                self._writev = False
                self.output.writelines(out)
                self.send_oct += sum(map(len, out))
            else:
                data = b"".join(out)
                self.output.write(data)
                self.send_oct += len(data)
            self.send_cnt += 1
        if self.owed_grants:
            self._grant_credit()

    def _grant_credit(self) -> None:
        if self._writing_paused or not self.owed_grants:
            return
        owed, self.owed_grants = self.owed_grants, set()
        holder = self.gateway.registry.holders.get
        for consumer in owed:
            channel = holder(consumer.holder)
            if channel is not None:
                channel.return_credit(consumer)

    def method(self, channel: int, method) -> None:
        self.send(frames.method_frame(channel, method))

    def snapshot(self) -> ConnectionInfo:
        """What the management API and the metrics show of this connection."""
        peer = self.peer if isinstance(self.peer, tuple) else ("?", 0)
        return ConnectionInfo(
            name=self.name, user=self.user, vhost=self.vhost.name if self.vhost else "",
            peer_host=peer[0], peer_port=peer[1], host=self.local[0], port=self.local[1],
            tls=self.tls,
            state=self.flow_state, client_properties=self.client_properties,
            connected_at=self.connected_at, frame_max=self.frame_max,
            channel_max=self.channel_max, heartbeat=self.heartbeat,
            recv_oct=self.recv_oct, recv_cnt=self.recv_cnt, send_oct=self.send_oct,
            send_cnt=self.send_cnt,
            channels=tuple(ch.snapshot() for _, ch in sorted(self.channels.items())))

    # -- flow control: credit, full shard rings, resource alarms -------------------

    @property
    def flow_state(self) -> str:
        """RabbitMQ's connection state: running, flow (held by credit), blocked
        (held by an alarm), or closing."""
        if self.state in (CLOSING, CLOSED):
            return "closing"
        if ALARM in self.paused_by:
            return "blocked"
        if self.gateway.alarms.active:  # RabbitMQ's name for "blocked at its next publish"
            return "blocking"
        if any(cause is not YIELD for cause in self.paused_by):
            return "flow"
        return "running"

    def hold(self, cause) -> None:
        """Stop reading for `cause` (a shard link out of credit or ring space, a
        channel with a full backlog, ALARM, YIELD...) until release(cause)."""
        if not self.paused_by and self.state != CLOSED:
            self.output.pause_reading()
        self.paused_by.add(cause)

    def release(self, cause) -> None:
        if cause not in self.paused_by:
            return
        self.paused_by.discard(cause)
        if not self.paused_by and self.state != CLOSED:
            # Not from here, which may be inside a shard's event dispatch.
            self.clock.call_soon(self._read_on)

    def _block(self, reason: str) -> None:
        """A resource alarm is on and a publish's content header is next: read no
        further until it clears. RabbitMQ's reader blocks there too (publish_received),
        not when the alarm goes up: a connection that does not publish meanwhile is
        never blocked, and one that does sends no publish, first or not, to a queue."""
        self.hold(ALARM)
        if self.capabilities.get("connection.blocked"):
            self.method(0, m.ConnectionBlocked(reason=reason))

    def unblock(self) -> None:
        """Every resource alarm cleared: read on from the held content header."""
        if ALARM in self.paused_by:
            self.release(ALARM)
            if self.capabilities.get("connection.blocked") and self.state != CLOSED:
                self.method(0, m.ConnectionUnblocked())

    def _next_turn(self) -> None:
        """Handle the next share of input held back by YIELD."""
        self.paused_by.discard(YIELD)
        self._read_on()

    def _read_on(self) -> None:
        """What was read before a pause comes first; the socket is read again only
        once none of it is left to handle. Reading at every release (a publisher
        held by credit is released after each shard turn) took in a socket buffer's
        worth each time and handled a slice: held input grew without bound (17 MB,
        97,000 messages, in a flood), outside every limit and every credit."""
        if self.paused_by or self.state == CLOSED:
            return
        self._handle_input()
        if not self.paused_by and self.state != CLOSED:
            self.output.resume_reading()

    # -- frames ----------------------------------------------------------------

    def _handle_frame(self, frame_type: int, channel: int, payload: bytes) -> None:
        if self.state == CLOSING:
            lifecycle.while_closing(self, frame_type, channel, payload)
            return
        if frame_type == frames.FRAME_HEARTBEAT:  # RabbitMQ's errors, in its order
            if payload:
                raise AMQPError(spec.FRAME_ERROR, f"type {frame_type}, "
                                f"{frames.payload_snippet(payload)}: unknown_frame")
            if channel == 0:
                return
            raise AMQPError(spec.UNEXPECTED_FRAME,
                            f"type {frame_type}, {frames.payload_snippet(payload)}")
        if channel == 0 or self.state != OPEN:
            if frame_type == frames.FRAME_METHOD and channel == 0:
                lifecycle.connection_method(self, decode_method(payload))
                return
            if frame_type not in (frames.FRAME_METHOD, frames.FRAME_HEADER, frames.FRAME_BODY):
                raise AMQPError(spec.FRAME_ERROR, f"type {frame_type}, "
                                f"{frames.payload_snippet(payload)}: unknown_frame")
            raise AMQPError(spec.UNEXPECTED_FRAME,
                            f"type {frame_type}, {frames.payload_snippet(payload)}")
        ch = self.channels.get(channel)
        if ch is None:
            lifecycle.open_channel(self, channel, frame_type, payload)
            return
        if ch.closing:
            lifecycle.closing_channel_frame(self, ch, frame_type, payload)
            return
        try:  # run_guarded, inlined: this runs for every frame
            ch.handle_frame(frame_type, payload)
        except AMQPError as error:
            if error.hard:
                self.close_with_error(error)
            else:
                self.close_channel_with_error(ch, error)

    def _handle_publish(self, channel: int, payload: bytes, properties: bytes,
                        body: bytes) -> None:
        """A whole publish taken from the reader at once; as its frames one by one
        would be, unless it is for an open channel that waits for no content."""
        ch = self.channels.get(channel)
        if ch is None or ch.closing or self.state != OPEN or ch.assembler.method is not None:
            self._handle_frame(frames.FRAME_METHOD, channel, payload)
            self._handle_frame(frames.FRAME_HEADER, channel,
                               frames.content_header(len(body), properties))
            if body:
                self._handle_frame(frames.FRAME_BODY, channel, body)
            return
        try:
            ch.handle_publish(payload, properties, body)
        except AMQPError as error:
            if error.hard:
                self.close_with_error(error)
            else:
                self.close_channel_with_error(ch, error)

    def run_guarded(self, channel: Channel, action) -> None:
        """Run channel work; a soft error closes that channel, a hard one the connection,
        and anything else (a bug) this connection alone."""
        try:
            action()
        except AMQPError as error:
            if error.hard:
                self.close_with_error(error)
            else:
                self.close_channel_with_error(channel, error)
        except Exception as error:
            self.fail(error)

    def fail(self, error: BaseException) -> None:
        """A bug met while serving this connection: log it once and close this
        connection with 541, leaving every other client and the loop running."""
        log_client_error(self.clock, "internal error", logging.ERROR,
                         "closing AMQP connection (%s) after an internal error", self.describe(),
                         exc_info=error, extra=self.log_fields())
        try:
            self.close_with_error(AMQPError(spec.INTERNAL_ERROR, "internal error"))
        except Exception:
            self.state = CLOSED
            self.output.abort()

    def close_channel_with_error(self, channel: Channel, error: AMQPError) -> None:
        log_client_error(self.clock, f"channel error {error.code}", logging.ERROR,
                         "Channel error on connection (%s), channel %d:\noperation %s caused a "
                         "channel exception %s: %s", self.describe(), channel.number,
                         operation(error), spec.REPLY_NAMES[error.code].lower(), error.detail,
                         extra=self.log_fields(channel=channel.number, reply_code=error.code))
        channel.release()
        channel.closing = True
        channel.send(m.ChannelClose(reply_code=error.code, reply_text=error.text[:255],
                                    class_id=error.class_id, method_id=error.method_id))

    @property
    def is_open(self) -> bool:
        return self.state == OPEN

    def forget_channel(self, channel: Channel) -> None:
        channel.release()
        self.channels.pop(channel.number, None)
        self.owed_confirms.discard(channel)
        if self.gateway.leader is not None:
            self.gateway.leader.channels_changed(self)

    # -- closing ---------------------------------------------------------------

    def close_with_error(self, error: AMQPError) -> None:
        """A hard error: send connection.close and wait (briefly) for close-ok."""
        if self.state in (CLOSING, CLOSED):
            return
        if self.state in (AWAIT_START_OK, AWAIT_TUNE_OK):
            lifecycle.handshake_error(self, error)
            return
        lifecycle.log_error(self, error)
        for channel in list(self.channels.values()):
            channel.release()
        self.method(0, m.ConnectionClose(reply_code=error.code, reply_text=error.text[:255],
                                         class_id=error.class_id, method_id=error.method_id))
        self.state = CLOSING
        if self.timer is not None:
            self.timer.cancel()
        self.timer = self.clock.call_later(CLOSE_OK_TIMEOUT, self.shutdown)

    def close_forced(self, reason: str) -> None:
        self.close_with_error(AMQPError(
            spec.CONNECTION_FORCED, f"broker forced connection closure with reason '{reason}'"))

    def close_for_shutdown(self) -> None:
        self.close_with_error(AMQPError(
            spec.CONNECTION_FORCED, "broker forced connection closure with reason 'shutdown'"))

    # -- the operator log ------------------------------------------------------------

    def describe(self) -> str:
        """The connection as RabbitMQ's log lines name it: 'peer -> local[ - client's
        name], vhost: '/', user: 'guest'' (what is known so far)."""
        parts = [self.log_name]
        if self.vhost is not None:
            parts.append(f"vhost: '{self.vhost.name}'")
        if self.user:
            parts.append(f"user: '{self.user}'")
        return ", ".join(parts)

    def log_fields(self, **more) -> dict:
        """The structured fields of a connection's log record (JSON lines)."""
        fields = {"connection": self.log_name, **more}
        if self.user:
            fields["user"] = self.user
        if self.vhost is not None:
            fields["vhost"] = self.vhost.name
        return fields

    def shutdown(self) -> None:
        if self.state == CLOSED:
            return
        self.flush()
        self.state = CLOSED
        self.output.close()

