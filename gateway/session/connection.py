"""One client connection: an asyncio.BufferedProtocol around the sans-IO framing.

Handshake (protocol header, start/start-ok, tune/tune-ok, open), heartbeats,
channel multiplexing, connection-level errors and flow control. Output for a
loop turn is gathered and written with one call; confirms and credit grants
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

Input: the transport reads the socket straight into the frame reader's buffer
(get_buffer, buffer_updated); bytes handed to data_received are copied in.
"""

from __future__ import annotations

import asyncio
import logging
import platform
import time
from typing import Callable

from warren.gateway import __version__
from warren.gateway.amqp import frames, spec
from warren.gateway.amqp import methods as m
from warren.gateway.amqp.fieldtable import FieldTableError, decode_table
from warren.gateway.amqp.frames import FrameError, FrameReader
from warren.gateway.errors import AMQPError
from warren.gateway.logthrottle import log_client_error
from warren.gateway.snapshots import ConnectionInfo
from warren.shards import records as r

from .assembly import decode_method
from .channel import Channel

log = logging.getLogger("warren.connection")

HANDSHAKE_TIMEOUT = 10.0
CLOSE_OK_TIMEOUT = 3.0
# An error before tune-ok closes the socket this long after, without a word to
# the client, as RabbitMQ (its SILENT_CLOSE_DELAY): a client not yet trusted
# learns nothing and cannot retry at once.
HANDSHAKE_ERROR_DELAY = 3.0
CHANNEL_MIN = 1  # the least channel_max a client may ask for (RabbitMQ's)
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
ADMIT = "admit"  # another gateway waits for gateway 0 to count this connection or channel
RELEASING = "releasing"  # connection.close waits for the shards to release its channels
LOGIN = "login"  # its credentials wait for their turn at the broker's login throttle

CAPABILITIES = {
    "publisher_confirms": True,
    "basic.nack": True,
    "consumer_cancel_notify": True,
    "connection.blocked": True,
    "consumer_priorities": True,
    "authentication_failure_close": True,
    "per_consumer_qos": True,
    "exchange_exchange_bindings": True,
    "direct_reply_to": True,
}

# Handshake states
AWAIT_HEADER, AWAIT_START_OK, AWAIT_TUNE_OK, AWAIT_OPEN, OPEN, CLOSING, CLOSED = range(7)
# RabbitMQ's names of them, in its log lines
STATE_NAMES = ("pre_init", "starting", "tuning", "opening", "running", "closing", "closed")


class Connection(asyncio.BufferedProtocol):
    def __init__(self, gateway):
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
        # The transport asks the reader for room itself: one Python frame less a read.
        self.get_buffer = self.reader.get_buffer
        self.channels: dict[int, Channel] = {}
        self.capabilities: dict = {}
        self.client_properties: dict = {}
        self.user = ""
        self.vhost = None
        self.transport: asyncio.Transport | None = None
        self.owed_confirms: set[Channel] = set()
        self.owed_grants: set = set()
        self._out: list[bytes] = []
        self._writev = False  # _out holds a large body's pieces: writelines, not a join
        self._flush_scheduled = False
        self._writing_paused = False
        # Why reading is held: shard links (credit spent, ring full), ALARM, or YIELD
        # (this turn's share of input is used up; the rest waits in the reader).
        self._paused_by: set = set()
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
        self._reads_seen = self._writes_seen = 0
        self._quiet_ticks = 0  # heartbeat ticks in a row that saw nothing read
        self._timer: asyncio.TimerHandle | None = None
        self._received_any = False
        self._end_logged = False  # why it ended is logged: no plain "closing" line
        # socket traffic, as RabbitMQ's recv_oct/recv_cnt/send_oct/send_cnt
        self.recv_oct = self.recv_cnt = self.send_oct = self.send_cnt = 0

    # -- asyncio.Protocol ------------------------------------------------------

    def connection_made(self, transport) -> None:
        self.transport = transport
        self.connected_at = time.time()
        self.peer = transport.get_extra_info("peername")
        peer = self.peer if isinstance(self.peer, tuple) else ("?", 0)
        local = transport.get_extra_info("sockname") or ("?", 0)
        self.name = f"{peer[0]}:{peer[1]} -> {local[0]}:{local[1]}"  # as RabbitMQ names it
        self.log_name = self.name  # with the client-provided name once known
        self.loop = asyncio.get_running_loop()
        self.gateway.registry.connections.add(self)
        self.gateway.totals.connections_opened += 1
        self._timer = self.loop.call_later(HANDSHAKE_TIMEOUT, self._handshake_timeout)

    def connection_lost(self, exc) -> None:
        if not self._received_any:  # a TCP health check, as RabbitMQ sees it
            log.debug("closing AMQP connection (%s): no data received", self.name,
                      extra=self._log_fields())
        elif self.state not in (CLOSING, CLOSED):
            log_client_error("unexpected close", logging.WARNING,
                             "closing AMQP connection (%s):\nclient unexpectedly closed TCP "
                             "connection", self._describe(), extra=self._log_fields())
        elif not self._end_logged:
            log.info("closing AMQP connection (%s)", self._describe(), extra=self._log_fields())
        self.state = CLOSED
        if self._timer is not None:
            self._timer.cancel()
        self._let_go()
        self.gateway.registry.connections.discard(self)
        self.gateway.totals.connections_closed += 1
        for link in self.gateway.shards:
            link.forget(self)

    def _let_go(self) -> None:
        """Release the channels (their unacked messages requeue, their consumers go)
        and the exclusive queues, and stop counting against the limits (gateway 0,
        told): before close-ok to the client's connection.close (RabbitMQ closes the
        channels first; a client reconnecting at once, through any gateway, finds its
        old connection gone), and again, with nothing left to do, when it ends."""
        for channel in list(self.channels.values()):
            channel.release()
        self.channels.clear()
        self.gateway.delete_exclusive_queues(self)

    def _after_releases(self, then: Callable[[], None]) -> None:
        """Call `then` once the shards have worked through the releases sent so far.
        With one gateway that is at once: a shard's one ring from it carries
        whatever the client sends next behind them. With several, the client's next
        connection may come in through another gateway, whose ring the shard may read
        first: a Sync behind the releases is answered when they are done (RabbitMQ's
        channels likewise wait for their queues before close-ok). Input waits."""
        gateway = self.gateway
        alone = gateway.leader is None and gateway.followers is None
        links = [] if alone else [link for link in gateway.shards.links if link.alive]
        if not links:
            then()
            return
        self._pause(RELEASING)
        left = len(links)

        def answered(reply: r.Reply) -> None:
            nonlocal left
            left -= 1
            if left == 0:
                then()  # (close-ok's _linger reads on itself: it drops what follows)
                self._resume(RELEASING)

        for link in links:
            link.request(r.Sync, answered)

    def _close_ok(self) -> None:
        if self.state != CLOSED:  # (the client may have hung up meanwhile)
            self.method(0, m.ConnectionCloseOk())
            self._linger()

    def buffer_updated(self, nbytes: int) -> None:
        # The transport holds the buffer until this returns: the reader is not
        # resized here (nor by what handles the frames).
        if self.state == CLOSED:  # lingering after close-ok: dropped
            return
        self.reader.buffer_updated(nbytes)
        if not self._received_any:  # RabbitMQ logs a connection once it sends something
            self._received_any = True
            log.info("accepting AMQP connection (%s)", self.name, extra=self._log_fields())
        self.recv_oct += nbytes
        self.recv_cnt += 1
        self._handle_input()

    def data_received(self, data: bytes) -> None:
        """Bytes handed over (a TLS handshake's early bytes): taken in as a read is."""
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
            if self.state == AWAIT_HEADER and not self._read_protocol_header():
                return
            reader = self.reader
            while self.state != CLOSED and not self._paused_by:
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
                    self._pause(YIELD)
                    self.loop.call_soon(self._next_turn)
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

    def _send_closing(self, method) -> None:
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
                self.transport.writelines(out)
                self.send_oct += sum(map(len, out))
            else:
                data = b"".join(out)
                self.transport.write(data)
                self.send_oct += len(data)
            self.send_cnt += 1
        if self.owed_grants:
            self._grant_credit()

    def _grant_credit(self) -> None:
        if self._writing_paused or not self.owed_grants:
            return
        owed, self.owed_grants = self.owed_grants, set()
        for consumer in owed:
            channel = self.gateway.registry.holders.get(consumer.holder)
            if channel is not None:
                channel.return_credit(consumer)

    def method(self, channel: int, method) -> None:
        self.send(frames.method_frame(channel, method))

    def snapshot(self) -> ConnectionInfo:
        """What the management API and the metrics show of this connection."""
        peer = self.peer if isinstance(self.peer, tuple) else ("?", 0)
        local = self.transport.get_extra_info("sockname") or ("?", 0)
        return ConnectionInfo(
            name=self.name, user=self.user, vhost=self.vhost.name if self.vhost else "",
            peer_host=peer[0], peer_port=peer[1], host=local[0], port=local[1],
            tls=self.transport.get_extra_info("sslcontext") is not None,
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
        if ALARM in self._paused_by:
            return "blocked"
        if self.gateway.alarms.active:  # RabbitMQ's name for "blocked at its next publish"
            return "blocking"
        if any(cause is not YIELD for cause in self._paused_by):
            return "flow"
        return "running"

    def hold(self, cause) -> None:
        """Stop reading for `cause` (a shard link out of credit or ring space, a
        channel with a full backlog) until release(cause)."""
        self._pause(cause)

    def release(self, cause) -> None:
        self._resume(cause)

    def _block(self, reason: str) -> None:
        """A resource alarm is on and a publish's content header is next: read no
        further until it clears. RabbitMQ's reader blocks there too (publish_received),
        not when the alarm goes up: a connection that does not publish meanwhile is
        never blocked, and one that does sends no publish, first or not, to a queue."""
        self._pause(ALARM)
        if self.capabilities.get("connection.blocked"):
            self.method(0, m.ConnectionBlocked(reason=reason))

    def unblock(self) -> None:
        """Every resource alarm cleared: read on from the held content header."""
        if ALARM in self._paused_by:
            self._resume(ALARM)
            if self.capabilities.get("connection.blocked") and self.state != CLOSED:
                self.method(0, m.ConnectionUnblocked())

    def _pause(self, cause) -> None:
        if not self._paused_by and self.state != CLOSED:
            self.transport.pause_reading()
        self._paused_by.add(cause)

    def _resume(self, cause) -> None:
        if cause not in self._paused_by:
            return
        self._paused_by.discard(cause)
        if not self._paused_by and self.state != CLOSED:
            # Not from here, which may be inside a shard's event dispatch.
            self.loop.call_soon(self._read_on)

    def _next_turn(self) -> None:
        """Handle the next share of input held back by YIELD."""
        self._paused_by.discard(YIELD)
        self._read_on()

    def _read_on(self) -> None:
        """What was read before a pause comes first; the socket is read again only
        once none of it is left to handle. Reading at every release (a publisher
        held by credit is released after each shard turn) took in a socket buffer's
        worth each time and handled a slice: held input grew without bound (17 MB,
        97,000 messages, in a flood), outside every limit and every credit."""
        if self._paused_by or self.state == CLOSED:
            return
        self._handle_input()
        if not self._paused_by and self.state != CLOSED:
            self.transport.resume_reading()

    # -- frames ----------------------------------------------------------------

    def _read_protocol_header(self) -> bool:
        header = self.reader.read_protocol_header()
        if header is None:
            return False
        if header != frames.PROTOCOL_HEADER:
            # Tell the client which protocol we speak, then hang up (AMQP 0-9-1 §4.2.2).
            log_client_error("protocol header", logging.ERROR,
                             "closing AMQP connection (%s):\nclient did not start with AMQP "
                             "protocol header: %r", self.name, header, extra=self._log_fields())
            self._end_logged = True
            self.transport.write(frames.PROTOCOL_HEADER)
            self.state = CLOSED
            self.transport.close()
            return False
        self.state = AWAIT_START_OK
        self.method(0, m.ConnectionStart(
            version_major=spec.SPEC["major-version"], version_minor=spec.SPEC["minor-version"],
            server_properties={
                "product": "Warren",
                "version": __version__,
                "platform": f"Python {platform.python_version()}",
                "copyright": "Warren developers",
                "information": "AMQP 0-9-1 broker; see README.md",
                "capabilities": dict(CAPABILITIES),
            },
            mechanisms=b"PLAIN AMQPLAIN", locales=b"en_US"))
        return True

    def _handle_frame(self, frame_type: int, channel: int, payload: bytes) -> None:
        if self.state == CLOSING:
            self._handle_while_closing(frame_type, channel, payload)
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
                self._connection_method(decode_method(payload))
                return
            if frame_type not in (frames.FRAME_METHOD, frames.FRAME_HEADER, frames.FRAME_BODY):
                raise AMQPError(spec.FRAME_ERROR, f"type {frame_type}, "
                                f"{frames.payload_snippet(payload)}: unknown_frame")
            raise AMQPError(spec.UNEXPECTED_FRAME,
                            f"type {frame_type}, {frames.payload_snippet(payload)}")
        ch = self.channels.get(channel)
        if ch is None:
            self._channel_open(channel, frame_type, payload)
            return
        if ch.closing:
            self._closing_channel_frame(ch, frame_type, payload)
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

    def run_guarded(self, ch: Channel, action) -> None:
        """Run channel work; a soft error closes that channel, a hard one the connection,
        and anything else (a bug) this connection alone."""
        try:
            action()
        except AMQPError as error:
            if error.hard:
                self.close_with_error(error)
            else:
                self.close_channel_with_error(ch, error)
        except Exception as error:
            self.fail(error)

    def fail(self, error: BaseException) -> None:
        """A bug met while serving this connection: log it once and close this
        connection with 541, leaving every other client and the loop running."""
        log_client_error("internal error", logging.ERROR,
                         "closing AMQP connection (%s) after an internal error", self._describe(),
                         exc_info=error, extra=self._log_fields())
        try:
            self.close_with_error(AMQPError(spec.INTERNAL_ERROR, "internal error"))
        except Exception:
            self.state = CLOSED
            self.transport.abort()

    def _channel_open(self, number: int, frame_type: int, payload: bytes) -> None:
        # As RabbitMQ: channel_max limits how many channels are open (closing ones
        # included), whatever their numbers; checked before the frame is looked at.
        if len(self.channels) >= self.channel_max:
            raise AMQPError(spec.NOT_ALLOWED, f"number of channels opened ({len(self.channels)})"
                            f" has reached the negotiated channel_max ({self.channel_max})")
        if frame_type != frames.FRAME_METHOD:
            raise AMQPError(spec.UNEXPECTED_FRAME,
                            "expected method frame, got non method frame instead")
        method = decode_method(payload)
        if type(method) is not m.ChannelOpen:
            raise AMQPError(spec.CHANNEL_ERROR, "expected 'channel.open'",
                            method.CLASS_ID, method.METHOD_ID)
        leader = self.gateway.leader
        if leader is None:
            refusal = self.gateway.limit_refusal(self.user, self.vhost.name, channel=True)
            if refusal is not None:
                raise AMQPError(spec.NOT_ALLOWED, refusal, method.CLASS_ID, method.METHOD_ID)
        elif self.gateway.access.user_limit(self.user, "max-channels") >= 0:
            self._pause(ADMIT)  # gateway 0 counts the user's channels broker-wide
            return leader.admit(self, self.vhost.name, len(self.channels) + 1,
                                lambda refusal: self._admitted(
                                    refusal, method, lambda: self._add_channel(number)))
        self._add_channel(number)

    def _add_channel(self, number: int) -> None:
        self.channels[number] = Channel(self, number)
        self.method(number, m.ChannelOpenOk())
        if self.gateway.leader is not None:
            self.gateway.leader.channels_changed(self)

    def close_channel_with_error(self, ch: Channel, error: AMQPError) -> None:
        log_client_error(f"channel error {error.code}", logging.ERROR,
                         "Channel error on connection (%s), channel %d:\noperation %s caused a "
                         "channel exception %s: %s", self._describe(), ch.number,
                         _operation(error), spec.REPLY_NAMES[error.code].lower(), error.detail,
                         extra=self._log_fields(channel=ch.number, reply_code=error.code))
        ch.release()
        ch.closing = True
        ch.send(m.ChannelClose(reply_code=error.code, reply_text=error.text[:255],
                               class_id=error.class_id, method_id=error.method_id))

    def _closing_channel_frame(self, ch: Channel, frame_type: int, payload: bytes) -> None:
        """After our channel.close only the client's close-ok ends the channel, as on
        RabbitMQ: a crossing close gets close-ok and the channel waits on for the
        client's; anything else is dropped, but a channel.open is an error."""
        if frame_type != frames.FRAME_METHOD:
            return
        method = decode_method(payload)
        kind = type(method)
        if kind is m.ChannelCloseOk:
            self.forget_channel(ch)
        elif kind is m.ChannelClose:
            ch.send(m.ChannelCloseOk())
        elif kind is m.ChannelOpen:
            raise AMQPError(spec.CHANNEL_ERROR, "second 'channel.open' seen",
                            method.CLASS_ID, method.METHOD_ID)

    @property
    def is_open(self) -> bool:
        return self.state == OPEN

    def forget_channel(self, ch: Channel) -> None:
        ch.release()
        self.channels.pop(ch.number, None)
        self.owed_confirms.discard(ch)
        if self.gateway.leader is not None:
            self.gateway.leader.channels_changed(self)

    def _handle_while_closing(self, frame_type: int, channel: int, payload: bytes) -> None:
        if channel != 0 or frame_type != frames.FRAME_METHOD:
            return
        method = decode_method(payload)
        if type(method) is m.ConnectionCloseOk:
            self._shutdown()
        elif type(method) is m.ConnectionClose:
            self._send_closing(m.ConnectionCloseOk())
            self._linger()

    # -- connection class ------------------------------------------------------

    def _connection_method(self, method) -> None:
        kind = type(method)
        expected = {AWAIT_START_OK: m.ConnectionStartOk, AWAIT_TUNE_OK: m.ConnectionTuneOk,
                    AWAIT_OPEN: m.ConnectionOpen, OPEN: m.ConnectionUpdateSecret}.get(self.state)
        if kind is not expected and kind is not m.ConnectionClose:
            # A second start-ok, an unasked close-ok, channel.open on channel 0...
            raise AMQPError(spec.CHANNEL_ERROR, "unexpected method in connection state "
                            f"{STATE_NAMES[self.state]}", method.CLASS_ID, method.METHOD_ID)
        if kind is m.ConnectionStartOk:
            self._start_ok(method)
        elif kind is m.ConnectionTuneOk:
            self._tune_ok(method)
        elif kind is m.ConnectionOpen:
            self._open(method)
        elif kind is m.ConnectionClose:
            self._let_go()
            self._after_releases(self._close_ok)
        else:  # connection.update-secret
            self.method(0, m.ConnectionUpdateSecretOk())

    def _start_ok(self, method: m.ConnectionStartOk) -> None:
        self.client_properties = method.client_properties
        capabilities = method.client_properties.get("capabilities")
        self.capabilities = capabilities if isinstance(capabilities, dict) else {}
        given = method.client_properties.get("connection_name")
        if isinstance(given, bytes):
            given = given.decode("utf-8", "replace")
        if isinstance(given, str) and given:
            log.info("connection (%s) has a client-provided name: %s", self.name, given,
                     extra=self._log_fields())
            self.log_name = f"{self.name} - {given}"
        name, password = self._credentials(method.mechanism, method.response)
        peer_host = self.peer[0] if isinstance(self.peer, tuple) else ""
        login = (name, password, peer_host, method.mechanism)
        access = self.gateway.access
        if not access.must_wait(peer_host):  # the common case: no waiting, nobody asked
            self._check_login(*login, False, 0.0)
            return
        # An address that failed often: its logins are checked one at a time, each
        # at its turn, however many connections it opens.
        self._pause(LOGIN)
        access.login_turn(peer_host, lambda wait: self._login_turn(wait, login))

    def _login_turn(self, wait: float | None, login: tuple, waited: float = 0.0) -> None:
        if self.state == CLOSED:
            return
        if wait is None:  # its turn is too far off: refused unchecked, as slowly
            self._resume(LOGIN)
            delay = self.gateway.access.throttle.cap
            log.warning("%s login refused: user '%s' - too many failed logins (from %s, "
                        "answered in %gs)", login[3], login[0] or "", login[2], delay,
                        extra=self._log_fields())
            self.state = CLOSING
            self._refuse_login(login[3], delay)
        elif wait:
            self.loop.call_later(wait, self._login_turn, 0.0, login, wait)
        else:
            self._resume(LOGIN)
            self._check_login(*login, True, waited)

    def _check_login(self, name, password, peer_host: str, mechanism: str, at_turn: bool,
                     waited: float) -> None:
        access = self.gateway.access
        reason = access.refusal(name, password, peer_host)
        if reason is not None:
            self.state = CLOSING  # what the client sends meanwhile is ignored
            access.login_failed(name, reason, peer_host, mechanism, at_turn, waited,
                                lambda delay: self._refuse_login(mechanism, delay))
            return
        self.user = name
        self.state = AWAIT_TUNE_OK
        self.method(0, m.ConnectionTune(channel_max=self.channel_max, frame_max=self.frame_max,
                                        heartbeat=self.heartbeat))

    def _credentials(self, mechanism: str, response: bytes) -> tuple[str | None, str | None]:
        if mechanism == "PLAIN":
            parts = response.split(b"\0")
            if len(parts) != 3:
                return None, None
            return parts[1].decode("utf-8", "replace"), parts[2].decode("utf-8", "replace")
        if mechanism == "AMQPLAIN":
            try:
                table, _ = decode_table(len(response).to_bytes(4, "big") + response, 0)
            except FieldTableError:
                return None, None
            user, password = table.get("LOGIN"), table.get("PASSWORD")
            if isinstance(user, bytes):
                user = user.decode("utf-8", "replace")
            if isinstance(password, bytes):
                password = password.decode("utf-8", "replace")
            return user, password
        raise AMQPError(spec.COMMAND_INVALID, f"unknown authentication mechanism '{mechanism}'")

    def _refuse_login(self, mechanism: str, delay: float) -> None:
        """Refuse, after `delay` seconds when the throttle asks for one; the loop
        serves everyone else meanwhile, and CLOSING ignores what this client sends."""
        if self.state == CLOSED:
            return
        if delay:
            self.state = CLOSING
            self._timer = self.loop.call_later(delay, self._refuse_login, mechanism, 0.0)
            return
        text = (f"ACCESS_REFUSED - Login was refused using authentication mechanism {mechanism}."
                " For details see the broker logfile.")
        if self.capabilities.get("authentication_failure_close"):
            self._send_closing(m.ConnectionClose(reply_code=spec.ACCESS_REFUSED, reply_text=text))
            self.state = CLOSING
            self._timer = self.loop.call_later(CLOSE_OK_TIMEOUT, self._shutdown)
        else:
            self._shutdown()

    def _tune_ok(self, method: m.ConnectionTuneOk) -> None:
        _negotiated("frame_max", method.frame_max, spec.FRAME_MIN_SIZE, self.frame_max)
        _negotiated("channel_max", method.channel_max, CHANNEL_MIN, self.channel_max)
        self.frame_max = method.frame_max
        self.channel_max = method.channel_max
        self.heartbeat = method.heartbeat
        self.reader.frame_max = self.frame_max
        self.state = AWAIT_OPEN

    def _open(self, method: m.ConnectionOpen) -> None:
        name = method.virtual_host
        vhost = self.gateway.catalogue.vhosts.get(name)
        refuse = None
        if vhost is None:
            refuse = f"vhost {name} not found"
        elif not self.gateway.access.may_use_vhost(self.user, name):
            refuse = f"access to vhost '{name}' refused for user '{self.user}'"
        elif self.gateway.leader is not None:  # gateway 0 counts connections broker-wide
            self._pause(ADMIT)
            self.gateway.leader.admit(self, name, 0, lambda refusal: self._admitted(
                refusal, method, lambda: self._opened(vhost)))
            return
        else:
            refuse = self.gateway.limit_refusal(self.user, name)
        if refuse is not None:
            raise AMQPError(spec.NOT_ALLOWED, refuse, method.CLASS_ID, method.METHOD_ID)
        self._opened(vhost)

    def _admitted(self, refusal: str, method, then) -> None:
        """Gateway 0 counted this connection or channel against the limits."""
        self._resume(ADMIT)
        if self.state == CLOSED:
            return
        if refusal:
            self.close_with_error(AMQPError(spec.NOT_ALLOWED, refusal, method.CLASS_ID,
                                            method.METHOD_ID))
            return
        try:
            then()
        except Exception as error:
            self.fail(error)

    def _opened(self, vhost) -> None:
        name = vhost.name
        self.vhost = vhost
        self.state = OPEN
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.heartbeat:
            self._timer = self.loop.call_later(self.heartbeat / 2, self._heartbeat_tick)
        log.info("connection (%s): user '%s' authenticated and granted access to vhost '%s'",
                 self.log_name, self.user, name, extra=self._log_fields())
        self.method(0, m.ConnectionOpenOk())

    # -- timers ----------------------------------------------------------------

    def _handshake_timeout(self) -> None:
        if self.state in (AWAIT_HEADER, AWAIT_START_OK, AWAIT_TUNE_OK, AWAIT_OPEN):
            log_client_error("handshake timeout", logging.ERROR,
                             "closing AMQP connection (%s):\nhandshake timeout in state %s",
                             self._describe(), STATE_NAMES[self.state], extra=self._log_fields())
            self._end_logged = True
            self._shutdown()

    def _heartbeat_tick(self) -> None:
        if self.state != OPEN:
            return
        # As RabbitMQ's heartbeat monitor, by the socket's counters: a tick (every half
        # interval) that sees nothing read since the last is a quiet one, and four in
        # a row are two missed intervals. While we are not reading, the peer's
        # heartbeats wait in the socket, unseen.
        if self.recv_cnt != self._reads_seen or self._paused_by:
            self._reads_seen = self.recv_cnt
            self._quiet_ticks = 0
        else:
            self._quiet_ticks += 1
        if self._quiet_ticks >= 4:
            log_client_error("missed heartbeats", logging.ERROR,
                             "closing AMQP connection (%s):\nmissed heartbeats from client, "
                             "timeout: %ss", self._describe(), self.heartbeat,
                             extra=self._log_fields())
            self._end_logged = True
            self.state = CLOSED
            self.transport.abort()
            return
        # An idle connection (most of them, when there are thousands) need not hold
        # a read buffer: it is allocated again by the next read.
        self.reader.release()
        if self.send_cnt == self._writes_seen:  # nothing written for half an interval
            self.send(frames.HEARTBEAT_FRAME)
        self._writes_seen = self.send_cnt  # (the heartbeat's own write counts next tick)
        self._timer = self.loop.call_later(self.heartbeat / 2, self._heartbeat_tick)

    # -- closing ---------------------------------------------------------------

    def close_with_error(self, error: AMQPError) -> None:
        """A hard error: send connection.close and wait (briefly) for close-ok."""
        if self.state in (CLOSING, CLOSED):
            return
        if self.state in (AWAIT_START_OK, AWAIT_TUNE_OK):
            self._handshake_error(error)
            return
        self._log_error(error)
        for channel in list(self.channels.values()):
            channel.release()
        self.method(0, m.ConnectionClose(reply_code=error.code, reply_text=error.text[:255],
                                         class_id=error.class_id, method_id=error.method_id))
        self.state = CLOSING
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self.loop.call_later(CLOSE_OK_TIMEOUT, self._shutdown)

    def _handshake_error(self, error: AMQPError) -> None:
        """An error before tune-ok, as RabbitMQ: logged, no connection.close, input
        dropped, and the socket closed HANDSHAKE_ERROR_DELAY later."""
        if self.state == AWAIT_TUNE_OK and error.code == spec.NOT_ALLOWED:
            detail = f"failed to negotiate connection parameters: {error.detail}"
        else:
            operation = _operation(error)
            detail = (f"{{handshake_error,{STATE_NAMES[self.state]},0,{{amqp_error,"
                      f"{spec.REPLY_NAMES[error.code].lower()},{_erlang_string(error.detail)},"
                      f"{operation if operation == 'none' else repr(operation.replace('-', '_'))}"
                      "}}")
        log_client_error("handshake error", logging.ERROR, "closing AMQP connection (%s):\n%s",
                         self._describe(), detail, extra=self._log_fields(reply_code=error.code))
        self._end_logged = True
        self.flush()  # what was sent before the error still goes out
        self.state = CLOSED  # what it sends is dropped (buffer_updated)
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self.loop.call_later(HANDSHAKE_ERROR_DELAY, self.transport.close)

    def close_forced(self, reason: str) -> None:
        self.close_with_error(AMQPError(
            spec.CONNECTION_FORCED, f"broker forced connection closure with reason '{reason}'"))

    def close_for_shutdown(self) -> None:
        self.close_with_error(AMQPError(
            spec.CONNECTION_FORCED, "broker forced connection closure with reason 'shutdown'"))

    # -- the operator log ------------------------------------------------------------

    def _describe(self) -> str:
        """The connection as RabbitMQ's log lines name it: 'peer -> local[ - client's
        name], vhost: '/', user: 'guest'' (what is known so far)."""
        parts = [self.log_name]
        if self.vhost is not None:
            parts.append(f"vhost: '{self.vhost.name}'")
        if self.user:
            parts.append(f"user: '{self.user}'")
        return ", ".join(parts)

    def _log_fields(self, **more) -> dict:
        """The structured fields of a connection's log record (JSON lines)."""
        fields = {"connection": self.log_name, **more}
        if self.user:
            fields["user"] = self.user
        if self.vhost is not None:
            fields["vhost"] = self.vhost.name
        return fields

    def _log_error(self, error: AMQPError) -> None:
        """A connection error in RabbitMQ's words: in the handshake its text alone,
        once running the operation and the exception's name."""
        if self.state == OPEN:
            detail = (f" operation {_operation(error)} caused a connection exception "
                      f"{spec.REPLY_NAMES[error.code].lower()}: \"{error.detail}\"")
        else:
            detail = error.detail
        log_client_error(f"connection error {error.code}", logging.ERROR,
                         "Error on AMQP connection (%s, state: %s):\n%s", self._describe(),
                         STATE_NAMES[self.state], detail,
                         extra=self._log_fields(reply_code=error.code))

    def _shutdown(self) -> None:
        if self.state == CLOSED:
            return
        self.flush()
        self.state = CLOSED
        self.transport.close()

    def _linger(self) -> None:
        """After close-ok to the client's connection.close, read and drop what it
        still sends until it hangs up (or CLOSE_OK_TIMEOUT), as RabbitMQ does:
        closing with unread data would send the client a reset, not an end."""
        self.flush()
        self.state = CLOSED
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self.loop.call_later(CLOSE_OK_TIMEOUT, self.transport.close)
        if self._paused_by:
            self._paused_by.clear()
            self.transport.resume_reading()


def _negotiated(field: str, value: int, minimum: int, offered: int) -> None:
    """tune-ok's value of `field` within RabbitMQ's bounds: 0 means no limit, which
    is more than any limit offered."""
    if value and value < minimum:
        bound = f"is lower than the minimum allowed value ({minimum})"
    elif offered and (not value or value > offered):
        bound = f"is higher than the maximum allowed value ({offered})"
    else:
        return
    no_limit = " (no limit)" if field == "channel_max" and not value else ""
    raise AMQPError(spec.NOT_ALLOWED, f"negotiated {field} = {value}{no_limit} {bound}",
                    m.ConnectionTuneOk.CLASS_ID, m.ConnectionTuneOk.METHOD_ID)


def _erlang_string(text: str) -> str:
    """`text` as Erlang's ~p writes a string."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _operation(error: AMQPError) -> str:
    """The method an error is about, as RabbitMQ names it ('queue.declare'), or 'none'."""
    method = spec.METHODS_BY_ID.get((error.class_id, error.method_id))
    return method.name if method is not None else "none"
