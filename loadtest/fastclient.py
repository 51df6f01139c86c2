"""A small, fast, blocking AMQP 0-9-1 client on Warren's own codec, for benchmarks.

It speaks to any AMQP 0-9-1 broker (Warren, RabbitMQ). Setup and teardown go
through the generated method classes (`gateway.amqp.methods`); the message hot paths
are hand-rolled so that the client is not the bottleneck of a benchmark:

* `Publisher` pre-encodes one whole message (method frame, content header, body
  frame(s)); per batch only the 8-byte timestamp at the start of the body is
  replaced, and the batch is the message repeated (`bytes * n`).
* `FastClient.publish_loop` sends such batches, optionally in confirm mode with a
  window of outstanding confirms, and records confirm latencies.
* `FastClient.consume_loop` parses deliveries straight from the receive buffer
  with `struct.unpack_from` (no per-frame objects), acks with multiple=true every
  N deliveries, and records end-to-end latencies from the body timestamp.

The timestamp is `time.time_ns()` (wall clock, comparable across processes).
"""

from __future__ import annotations

import select
import socket
import struct
import time
from array import array
from typing import Any, Callable
from urllib.parse import unquote, urlparse

from warren.gateway.amqp import frames
from warren.gateway.amqp import methods as m
from warren.gateway.amqp.properties import BasicProperties, encode_properties

DEFAULT_URL = "amqp://guest:guest@127.0.0.1:5672/%2F"
FRAME_MAX = 131072
BASIC_CLASS = m.BasicPublish.CLASS_ID

_prefix = struct.Struct(">BHI")
_ids = struct.Struct(">HH")
_u64 = struct.Struct(">Q")
_ack_frame = struct.Struct(">BHIHHQB")  # a whole basic.ack frame but its frame-end octet
_END = frames.FRAME_END_BYTE

DELIVER = (m.BasicDeliver.CLASS_ID, m.BasicDeliver.METHOD_ID)
ACK = (m.BasicAck.CLASS_ID, m.BasicAck.METHOD_ID)
NACK = (m.BasicNack.CLASS_ID, m.BasicNack.METHOD_ID)
_DELIVER_IDS = _ids.pack(*DELIVER)
_ACK_CID, _ACK_MID = ACK
_NACK_CID, _NACK_MID = NACK

#: At most this many latency samples are kept per loop (8 bytes each).
MAX_SAMPLES = 2_000_000


class AMQPError(Exception):
    def __init__(self, code: int, text: str, where: str = ""):
        super().__init__(f"{code} {text}" + (f" ({where})" if where else ""))
        self.code = code
        self.text = text


class ChannelClosed(AMQPError):
    """The broker closed a channel (channel.close)."""


class ConnectionClosed(AMQPError):
    """The broker closed the connection (connection.close or end of stream)."""


def parse_url(url: str) -> tuple[str, int, str, str, str]:
    """(host, port, user, password, vhost) of amqp://user:pass@host:port/vhost."""
    parsed = urlparse(url)
    if parsed.scheme not in ("amqp", ""):
        raise ValueError(f"only amqp:// URLs are supported, not {url!r}")
    path = parsed.path[1:] if parsed.path.startswith("/") else parsed.path
    vhost = unquote(path) if path else "/"
    return (parsed.hostname or "127.0.0.1", parsed.port or 5672,
            unquote(parsed.username or "guest"), unquote(parsed.password or "guest"), vhost)


class Publisher:
    """One pre-encoded message whose body starts with an 8-byte timestamp."""

    def __init__(self, channel: int, exchange: str, routing_key: str, body_size: int,
                 persistent: bool, frame_max: int, properties: BasicProperties | None = None):
        if body_size < 8:
            raise ValueError("bodies carry an 8-byte timestamp: body_size must be >= 8")
        props = properties or BasicProperties()
        if persistent:
            props.delivery_mode = 2
        method = m.encode_method(m.BasicPublish(exchange=exchange, routing_key=routing_key))
        placeholder = b"\x00" * 8 + bytes(body_size - 8)
        self.template = frames.content_frames(channel, method, BASIC_CLASS,
                                              encode_properties(props), placeholder, frame_max)
        # The body's first frame starts after the method and header frames.
        header_frame = 7 + 12 + len(encode_properties(props)) + 1
        self.ts_offset = 7 + len(method) + 1 + header_frame + 7
        self.head = self.template[:self.ts_offset]
        self.tail = self.template[self.ts_offset + 8:]
        self.size = len(self.template)

    def batch(self, count: int, ts_ns: int) -> bytes:
        return (self.head + _u64.pack(ts_ns) + self.tail) * count


class FastClient:
    def __init__(self, url: str = DEFAULT_URL, timeout: float = 30.0, frame_max: int = FRAME_MAX,
                 name: str = "warren-bench"):
        host, port, user, password, vhost = parse_url(url)
        self.timeout = timeout
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = bytearray()
        self.pos = 0
        self.frame_max = frame_max
        self.next_channel = 1
        self.blocked = False
        self.server_properties: dict = {}
        self._handshake(user, password, vhost, name)

    # -- plumbing ---------------------------------------------------------------------

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send_method(self, channel: int, method: m.Method) -> None:
        self.sock.sendall(frames.method_frame(channel, method))

    def _fill(self, timeout: float | None) -> bool:
        """Receive more data; False if none arrived within timeout (None: self.timeout)."""
        if timeout is not None:
            ready, _, _ = select.select([self.sock], [], [], max(0.0, timeout))
            if not ready:
                return False
        try:
            data = self.sock.recv(1 << 20)
        except socket.timeout:
            return False
        if not data:
            raise ConnectionClosed(320, "connection closed by the broker (end of stream)")
        if self.pos:
            del self.buf[:self.pos]
            self.pos = 0
        self.buf += data
        return True

    def next_frame(self, timeout: float | None = None) -> tuple[int, int, bytes] | None:
        """The next complete frame, or None when none arrived in time."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while True:
            buf, pos = self.buf, self.pos
            if len(buf) - pos >= 7:
                frame_type, channel, size = _prefix.unpack_from(buf, pos)
                end = pos + 7 + size
                if len(buf) > end:
                    if buf[end] != frames.FRAME_END:
                        raise ConnectionClosed(501, f"bad frame end octet {buf[end]}")
                    self.pos = end + 1
                    return frame_type, channel, bytes(buf[pos + 7:end])
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not self._fill(remaining):
                if time.monotonic() >= deadline:
                    return None

    def _control(self, channel: int, method: m.Method) -> None:
        """Methods that may arrive at any time: closes, blocked/unblocked, cancels."""
        if isinstance(method, m.ChannelClose):
            self.send_method(channel, m.ChannelCloseOk())
            raise ChannelClosed(method.reply_code, method.reply_text,
                                f"class {method.class_id} method {method.method_id}")
        if isinstance(method, m.ConnectionClose):
            try:
                self.send_method(0, m.ConnectionCloseOk())
            except OSError:
                pass
            raise ConnectionClosed(method.reply_code, method.reply_text)
        if isinstance(method, m.ConnectionBlocked):
            self.blocked = True
        elif isinstance(method, m.ConnectionUnblocked):
            self.blocked = False
        elif isinstance(method, m.BasicCancel):
            raise ChannelClosed(0, f"consumer {method.consumer_tag} cancelled by the broker")

    def rpc(self, channel: int, method: m.Method, *answers: type[m.Method],
            timeout: float | None = None) -> m.Method:
        """Send a synchronous method and wait for its answer on the same channel;
        frames of other channels (and content) are skipped."""
        self.send_method(channel, method)
        return self.wait_for(channel, answers, timeout)

    def wait_for(self, channel: int, answers: tuple[type[m.Method], ...],
                 timeout: float | None = None) -> m.Method:
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while True:
            frame = self.next_frame(max(0.0, deadline - time.monotonic()))
            if frame is None:
                names = ", ".join(answer.NAME for answer in answers)
                waited = self.timeout if timeout is None else timeout
                raise TimeoutError(f"no {names} within {waited}s")
            frame_type, frame_channel, payload = frame
            if frame_type != frames.FRAME_METHOD:
                continue
            method = m.decode_method(payload)
            if frame_channel in (0, channel):
                self._control(frame_channel, method)
            if frame_channel == channel and isinstance(method, answers):
                return method

    def _handshake(self, user: str, password: str, vhost: str, name: str) -> None:
        self.send(frames.PROTOCOL_HEADER)
        start = self.wait_for(0, (m.ConnectionStart,))
        self.server_properties = start.server_properties
        client_properties = {
            "product": "warren-bench", "connection_name": name,
            "capabilities": {"publisher_confirms": True, "consumer_cancel_notify": True,
                             "connection.blocked": True, "basic.nack": True}}
        self.send_method(0, m.ConnectionStartOk(
            client_properties=client_properties, mechanism="PLAIN",
            response=b"\0" + user.encode() + b"\0" + password.encode(), locale="en_US"))
        tune = self.wait_for(0, (m.ConnectionTune,))
        if tune.frame_max:
            self.frame_max = min(self.frame_max, tune.frame_max)
        self.send_method(0, m.ConnectionTuneOk(channel_max=tune.channel_max,
                                               frame_max=self.frame_max, heartbeat=0))
        self.rpc(0, m.ConnectionOpen(virtual_host=vhost), m.ConnectionOpenOk)

    # -- AMQP operations ----------------------------------------------------------------

    def open_channel(self) -> int:
        channel = self.next_channel
        self.next_channel += 1
        self.rpc(channel, m.ChannelOpen(), m.ChannelOpenOk)
        return channel

    def queue_declare(self, channel: int, queue: str, durable: bool = False,
                      arguments: dict | None = None, passive: bool = False,
                      exclusive: bool = False, auto_delete: bool = False) -> m.QueueDeclareOk:
        return self.rpc(channel, m.QueueDeclare(queue=queue, durable=durable, passive=passive,
                                                exclusive=exclusive, auto_delete=auto_delete,
                                                arguments=arguments or {}),
                        m.QueueDeclareOk)

    def queue_delete(self, channel: int, queue: str) -> int:
        return self.rpc(channel, m.QueueDelete(queue=queue), m.QueueDeleteOk).message_count

    def qos(self, channel: int, prefetch_count: int) -> None:
        self.rpc(channel, m.BasicQos(prefetch_count=prefetch_count), m.BasicQosOk)

    def consume(self, channel: int, queue: str, no_ack: bool, tag: str = "") -> str:
        return self.rpc(channel, m.BasicConsume(queue=queue, consumer_tag=tag, no_ack=no_ack),
                        m.BasicConsumeOk).consumer_tag

    def confirm_select(self, channel: int) -> None:
        self.rpc(channel, m.ConfirmSelect(), m.ConfirmSelectOk)

    def close(self, timeout: float = 5.0) -> None:
        try:
            self.send_method(0, m.ConnectionClose(reply_code=200, reply_text="bye"))
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                frame = self.next_frame(deadline - time.monotonic())
                if frame is None:
                    break
                if frame[0] == frames.FRAME_METHOD and frame[1] == 0 and \
                        _ids.unpack_from(frame[2], 0) == (m.ConnectionCloseOk.CLASS_ID,
                                                           m.ConnectionCloseOk.METHOD_ID):
                    break
        except (OSError, AMQPError):
            pass
        finally:
            self.sock.close()

    def abort(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass

    # -- hot loops ----------------------------------------------------------------------

    def _control_frames(self, channel: int) -> list[tuple[int, bool, bool]]:
        """Parse buffered frames of a publisher: confirms (tag, multiple, ack?) and controls."""
        confirms: list[tuple[int, bool, bool]] = []
        buf = self.buf
        pos = self.pos
        n = len(buf)
        while n - pos >= 7:
            frame_type, frame_channel, size = _prefix.unpack_from(buf, pos)
            end = pos + 7 + size
            if end >= n:
                break
            if frame_type == 1:
                cid, mid = _ids.unpack_from(buf, pos + 7)
                if cid == _ACK_CID and (mid == _ACK_MID or mid == _NACK_MID):
                    tag = _u64.unpack_from(buf, pos + 11)[0]
                    confirms.append((tag, bool(buf[pos + 19] & 1), mid == _ACK_MID))
                else:
                    self.pos = end + 1
                    self._control(frame_channel, m.decode_method(bytes(buf[pos + 7:end])))
            pos = end + 1
        self.pos = pos
        return confirms

    def publish_loop(self, publisher: Publisher, *, duration: float | None = None,
                     limit: int | None = None, confirm_window: int = 0, batch: int = 100,
                     lag: Callable[[int], int] | None = None, max_lag: int = 0,
                     should_stop: Callable[[], bool] | None = None,
                     confirm_timeout: float = 30.0,
                     on_published: Callable[[int], None] | None = None,
                     rate: float = 0.0) -> dict[str, Any]:
        """Publish for `duration` seconds or `limit` messages, whichever comes first.

        confirm_window > 0: the channel is in confirm mode; at most that many
        messages are outstanding, and after publishing stops the loop waits up to
        confirm_timeout for the remaining confirms. lag(published) -> messages
        published but not yet consumed; publishing pauses while it is >= max_lag.
        rate > 0: at most that many messages per second.
        """
        sock = self.sock
        time_ns = time.time_ns
        monotonic = time.monotonic
        started = monotonic()
        t_start = time.time()
        end_at = started + duration if duration is not None else float("inf")
        limit = limit if limit is not None else 1 << 62
        if rate:
            # At most about a millisecond's worth of messages per send.
            batch = max(1, min(batch, int(rate / 1000)))
        published = 0
        confirmed = 0  # frontier: every sequence number <= confirmed is answered
        nacked = 0
        answered_beyond: set[int] = set()  # individually answered tags above the frontier
        pending: list[list[int]] = []  # [first_seq, last_seq, send_ns] of unconfirmed batches
        pending_head = 0
        latencies = array("q")
        t_last_confirm = t_start
        blocked_seconds = 0.0
        polls = 0

        def settle(confirms: list[tuple[int, bool, bool]]) -> None:
            nonlocal confirmed, nacked, pending_head, t_last_confirm
            if not confirms:
                return
            for tag, multiple, ok in confirms:
                if not ok:
                    nacked += tag - confirmed if multiple and tag > confirmed else (
                        0 if tag <= confirmed else 1)
                if multiple:
                    if tag > confirmed:
                        confirmed = tag
                        if answered_beyond:
                            for seen in [t for t in answered_beyond if t <= tag]:
                                answered_beyond.discard(seen)
                elif tag == confirmed + 1:
                    confirmed = tag
                elif tag > confirmed:
                    answered_beyond.add(tag)
                while answered_beyond and confirmed + 1 in answered_beyond:
                    answered_beyond.discard(confirmed + 1)
                    confirmed += 1
            now = time_ns()
            t_last_confirm = now / 1e9
            while pending_head < len(pending) and pending[pending_head][0] <= confirmed:
                entry = pending[pending_head]
                upto = min(entry[1], confirmed)
                count = upto - entry[0] + 1
                if len(latencies) < MAX_SAMPLES:
                    latencies.extend([(now - entry[2]) // 1000] * count)
                if upto == entry[1]:
                    pending_head += 1
                else:
                    entry[0] = upto + 1
            if pending_head > 4096:
                del pending[:pending_head]
                pending_head = 0

        while published < limit:
            now = monotonic()
            if now >= end_at or (should_stop is not None and should_stop()):
                break
            room = min(batch, limit - published)
            if rate:
                ahead = started + published / rate - now
                if ahead > 0:
                    # Ahead of schedule: sleep, still answering confirms.
                    if self._fill(min(ahead, 0.05)):
                        settle(self._control_frames(0))
                    continue
            if max_lag and lag is not None:
                room = min(room, max_lag - lag(published))
            if confirm_window:
                room = min(room, confirm_window - (published - confirmed - len(answered_beyond)))
            if room <= 0 or self.blocked:
                # Wait for confirms (or consumers) to make room.
                waited = monotonic()
                if self._fill(0.0005 if not confirm_window else 0.05):
                    settle(self._control_frames(0))
                if self.blocked:
                    blocked_seconds += monotonic() - waited
                continue
            ts = time_ns()
            data = publisher.batch(room, ts)
            sock.sendall(data)
            if confirm_window:
                pending.append([published + 1, published + room, ts])
            published += room
            if on_published is not None:
                on_published(published)
            polls += 1
            if confirm_window or polls % 16 == 0:
                if self._fill(0.0):
                    settle(self._control_frames(0))
        t_end_publish = time.time()
        if confirm_window:
            deadline = monotonic() + confirm_timeout
            while confirmed + len(answered_beyond) < published and monotonic() < deadline:
                if self._fill(min(0.1, max(0.0, deadline - monotonic()))):
                    settle(self._control_frames(0))
        return {"published": published, "confirmed": confirmed + len(answered_beyond) - nacked
                if confirm_window else 0, "nacked": nacked, "t_start": t_start,
                "t_end_publish": t_end_publish, "t_last_confirm": t_last_confirm,
                "confirm_latency_us": latencies, "blocked_s": blocked_seconds}

    def consume_loop(self, channel: int, *, no_ack: bool, ack_every: int = 50,
                     should_stop: Callable[[int], bool], deadline: float,
                     on_delivered: Callable[[int], None] | None = None) -> dict[str, Any]:
        """Receive deliveries until should_stop(delivered) or the monotonic deadline.

        Manual-ack consumers ack with multiple=true every ack_every deliveries (and
        once at the end). End-to-end latency = receive time - body timestamp.
        """
        sock = self.sock
        unpack_prefix = _prefix.unpack_from
        unpack_u64 = _u64.unpack_from
        time_ns = time.time_ns
        monotonic = time.monotonic
        latencies = array("q")
        record = latencies.append
        ack_pack = _ack_frame.pack
        delivered = 0
        bytes_received = 0
        last_tag = 0
        acked_tag = 0
        expecting_body = False
        t_first = t_last = 0.0
        seen = 0
        buf = self.buf
        pos = self.pos
        while True:
            n = len(buf)
            while n - pos >= 7:
                frame_type, frame_channel, size = unpack_prefix(buf, pos)
                end = pos + 7 + size
                if end >= n:
                    break
                if frame_type == 3:
                    if expecting_body:
                        expecting_body = False
                        if len(latencies) < MAX_SAMPLES:
                            record((time_ns() - unpack_u64(buf, pos + 7)[0]) // 1000)
                    bytes_received += size
                elif frame_type == 1:
                    if buf[pos + 7:pos + 11] == _DELIVER_IDS:
                        delivered += 1
                        last_tag = unpack_u64(buf, pos + 12 + buf[pos + 11])[0]
                        expecting_body = True
                        if not no_ack and last_tag - acked_tag >= ack_every:
                            sock.sendall(ack_pack(1, channel, 13, _ACK_CID, _ACK_MID,
                                                  last_tag, 1) + _END)
                            acked_tag = last_tag
                    else:
                        self.pos = end + 1
                        self._control(frame_channel, m.decode_method(bytes(buf[pos + 7:end])))
                elif frame_type == 2:
                    # content header: an empty body has no body frame
                    if unpack_u64(buf, pos + 11)[0] < 8:
                        expecting_body = False
                pos = end + 1
            self.pos = pos
            if delivered != seen:
                seen = delivered
                t_last = time.time()
                if not t_first:
                    t_first = t_last
                if on_delivered is not None:
                    on_delivered(delivered)
            if should_stop(delivered) or monotonic() >= deadline:
                break
            if self._fill(0.05):
                buf = self.buf
                pos = self.pos
        if not no_ack and last_tag > acked_tag:
            sock.sendall(ack_pack(1, channel, 13, _ACK_CID, _ACK_MID, last_tag, 1) + _END)
        return {"delivered": delivered, "bytes": bytes_received, "t_first": t_first,
                "t_last": t_last, "e2e_latency_us": latencies}
