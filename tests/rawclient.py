"""A minimal AMQP client on the project's own codec, for tests that need to send
what real client libraries never would (bad frames, wrong states, no capabilities)."""

from __future__ import annotations

import socket
import struct
import time

from warren.gateway.amqp import frames, spec
from warren.gateway.amqp import methods as m
from warren.gateway.amqp.fieldtable import encode_table
from warren.gateway.amqp.frames import FrameReader


class RawClient:
    def __init__(self, port: int, timeout: float = 10.0, source: str | None = None):
        """`source`: the local address to connect from (another loopback one, say)."""
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout,
                                             source_address=(source, 0) if source else None)
        self.reader = FrameReader(1 << 20)
        self.timeout = timeout

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send_method(self, channel: int, method) -> None:
        self.send(frames.method_frame(channel, method))

    def send_frame(self, frame_type: int, channel: int, payload: bytes, end: int = 0xCE) -> None:
        self.send(struct.pack(">BHI", frame_type, channel, len(payload)) + payload + bytes((end,)))

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

    def next_method(self, timeout: float | None = None):
        """The next method (skipping heartbeats and content), or None at EOF."""
        while True:
            frame = self.next_frame(timeout)
            if frame is None:
                return None
            frame_type, channel, payload = frame
            if frame_type == frames.FRAME_METHOD:
                return channel, m.decode_method(payload)

    def handshake(self, capabilities: dict | None = None, user: str = "guest",
                  password: str = "guest", heartbeat: int = 0,
                  channel_max: int | None = None) -> None:
        self.send(frames.PROTOCOL_HEADER)
        _, start = self.next_method()
        assert isinstance(start, m.ConnectionStart)
        props = {"product": "rawclient", "capabilities": capabilities or {}}
        self.send_method(0, m.ConnectionStartOk(
            client_properties=props, mechanism="PLAIN",
            response=b"\0" + user.encode() + b"\0" + password.encode(), locale="en_US"))
        _, tune = self.next_method()
        assert isinstance(tune, m.ConnectionTune), tune
        self.send_method(0, m.ConnectionTuneOk(channel_max=channel_max or tune.channel_max,
                                               frame_max=tune.frame_max, heartbeat=heartbeat))
        self.send_method(0, m.ConnectionOpen(virtual_host="/"))
        _, open_ok = self.next_method()
        assert isinstance(open_ok, m.ConnectionOpenOk), open_ok

    def open_channel(self, number: int = 1) -> None:
        self.send_method(number, m.ChannelOpen())
        channel, ok = self.next_method()
        assert (channel, type(ok)) == (number, m.ChannelOpenOk)

    def close(self) -> None:
        self.sock.close()


__all__ = ["RawClient", "encode_table", "spec"]
