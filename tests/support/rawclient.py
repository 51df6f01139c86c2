"""A minimal AMQP client on the project's own codec, for tests that need to send
what real client libraries never would (bad frames, wrong states, no capabilities):
the conversation, and RawClient, which carries it over TCP (tests/support/session.py's
Client carries it in-process)."""

from __future__ import annotations

import socket
import struct
import time

from warren.gateway.amqp import frames, spec
from warren.gateway.amqp import methods as m
from warren.gateway.amqp.fieldtable import encode_table
from warren.gateway.amqp.frames import FrameReader


class Conversation:
    """What a test client says, whatever carries it: a subclass provides
    send(data) and next_frame(timeout) (the next frame, or None once the broker
    has closed the connection)."""

    def send_method(self, channel: int, method) -> None:
        self.send(frames.method_frame(channel, method))

    def send_frame(self, frame_type: int, channel: int, payload: bytes, end: int = 0xCE) -> None:
        self.send(struct.pack(">BHI", frame_type, channel, len(payload)) + payload + bytes((end,)))

    def publish(self, channel: int, routing_key: str, body: bytes, exchange: str = "",
                mandatory: bool = False, properties: bytes = b"\x00\x00") -> None:
        method = m.encode_method(m.BasicPublish(exchange=exchange, routing_key=routing_key,
                                                mandatory=mandatory))
        self.send(frames.content_frames(channel, method, 60, properties, body, 131072))

    def next_method(self, timeout: float | None = None):
        """The next (channel, method), skipping heartbeats and content; None at EOF."""
        while True:
            frame = self.next_frame(timeout)
            if frame is None:
                return None
            frame_type, channel, payload = frame
            if frame_type == frames.FRAME_METHOD:
                return channel, m.decode_method(payload)

    def expect(self, channel: int, kind: type):
        """The next method, which must be a `kind` on `channel`."""
        got = self.next_method()
        assert got is not None, f"the broker closed the connection instead of {kind.NAME}"
        assert got[0] == channel and type(got[1]) is kind, got
        return got[1]

    def content(self) -> tuple[bytes, bytes]:
        """(properties, body) of the content that follows a delivery or get-ok."""
        frame_type, _, payload = self.next_frame()
        assert frame_type == frames.FRAME_HEADER, (frame_type, payload)
        size = struct.unpack_from(">Q", payload, 4)[0]
        properties, body = payload[12:], b""
        while len(body) < size:
            frame_type, _, payload = self.next_frame()
            assert frame_type == frames.FRAME_BODY, (frame_type, payload)
            body += payload
        return properties, body

    def call(self, channel: int, method, kind: type):
        """Send a method and return its answer, which must be a `kind`."""
        self.send_method(channel, method)
        return self.expect(channel, kind)

    def handshake(self, capabilities: dict | None = None, user: str = "guest",
                  password: str = "guest", heartbeat: int = 0,
                  channel_max: int | None = None, vhost: str = "/") -> None:
        self.send(frames.PROTOCOL_HEADER)
        self.expect(0, m.ConnectionStart)
        props = {"product": "rawclient", "capabilities": capabilities or {}}
        self.send_method(0, m.ConnectionStartOk(
            client_properties=props, mechanism="PLAIN",
            response=b"\0" + user.encode() + b"\0" + password.encode(), locale="en_US"))
        tune = self.expect(0, m.ConnectionTune)
        self.send_method(0, m.ConnectionTuneOk(channel_max=channel_max or tune.channel_max,
                                               frame_max=tune.frame_max, heartbeat=heartbeat))
        self.send_method(0, m.ConnectionOpen(virtual_host=vhost))
        self.expect(0, m.ConnectionOpenOk)

    def open_channel(self, number: int = 1) -> None:
        self.call(number, m.ChannelOpen(), m.ChannelOpenOk)


class RawClient(Conversation):
    """A Conversation over a TCP socket."""

    def __init__(self, port: int, timeout: float = 10.0, source: str | None = None):
        """`source`: the local address to connect from (another loopback one, say)."""
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout,
                                             source_address=(source, 0) if source else None)
        self.reader = FrameReader(1 << 20)
        self.timeout = timeout

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def next_frame(self, timeout: float | None = None):
        """The next frame, or None when the server closed the connection."""
        deadline = time.monotonic() + (timeout or self.timeout)
        while True:
            frame = self.reader.next_frame()
            if frame is not None:
                return frame
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            data = self.sock.recv(65536)
            if not data:
                return None
            self.reader.receive_data(data)

    def close(self) -> None:
        self.sock.close()


__all__ = ["Conversation", "RawClient", "encode_table", "spec"]
